//! The `runas` example's worker: the request handler of each worker process, which runs as
//! `--user` (default `nobody`) with no capability. It takes the HTTP request, reads the
//! XML-RPC call, checks it against its copy of the policy, and asks its privileged helper
//! to run it; it answers with the helper's result or a fault, and penalises a bad token
//! (`Conn::penalize`).
//!
//! It is the side of the trust boundary that reads the network, and it holds nothing that
//! could run a command: what it may ask of the helper is `protocol::Request`, nothing
//! more, and the helper checks it again.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::rc::Rc;
use std::time::Duration;

use appsrv::codec::{Http, HttpRequest, HttpResponse};

use crate::exec::DRAIN_AFTER_KILL;
use crate::helper::RunHelper;
use crate::policy::Policy;
use crate::protocol::Request;
use crate::xmlrpc::{
    FAULT_AUTH, FAULT_EXEC, FAULT_METHOD, FAULT_PARAMS, Fault, Value, parse_call, response_xml,
};

/// The largest request body (the HTTP codec answers 413 above it).
const MAX_BODY: usize = 64 * 1024;

/// A worker's handler: it runs as `--user` (default `nobody`), with no capability, and
/// cannot start a process as anyone (under `--sandbox`, no process at all): it asks its
/// privileged helper ([`RunHelper`]) for what the policy allows.
pub(crate) struct RunAs {
    pub(crate) policy: Rc<Policy>,
    /// `--unchecked-workers` (tests only): forward every call to the helper unchecked.
    pub(crate) unchecked: bool,
}

impl appsrv::RequestHandler for RunAs {
    type Codec = Http;
    type Session = ();

    fn codec(&self) -> Http {
        Http::new().max_body(MAX_BODY)
    }

    fn handle_request(
        &mut self,
        conn: &mut appsrv::Conn<'_>,
        req: &HttpRequest<'_>,
        res: &mut HttpResponse<'_>,
    ) -> io::Result<()> {
        if req.path() != "/RPC2" && req.path() != "/" {
            return plain(res, 404, "not found: the XML-RPC endpoint is /RPC2\n");
        }
        if req.method() != "POST" {
            res.header("Allow", "POST");
            return plain(res, 405, "method not allowed: XML-RPC calls are POSTed\n");
        }
        // text/xml, as the specification says. It also keeps browsers from sending a call
        // cross-site without a CORS preflight (which this server never grants).
        let xml_type = req.header_str("Content-Type").is_some_and(|t| {
            let t = t.split(';').next().unwrap_or("").trim();
            t.eq_ignore_ascii_case("text/xml") || t.eq_ignore_ascii_case("application/xml")
        });
        if !xml_type {
            return plain(res, 415, "unsupported media type: send text/xml\n");
        }
        let mut result =
            parse_call(req.body()).and_then(|(method, params)| self.call(conn, &method, &params));
        if let Err(f) = &mut result {
            // A wrong token, found by this worker's check or by its helper's: the client's
            // address is refused new connections for a while, across all workers (1 s,
            // doubling with each failure in a row, up to --penalty-max), and this
            // connection ends after the fault. Guessing the token is slowed from about
            // 8,000 attempts a second to a handful a minute, then one per --penalty-max.
            if f.code == FAULT_AUTH {
                if let Some(wait) = conn.penalize() {
                    let _ = write!(
                        f.message,
                        "; new connections from your address are refused for {} s",
                        wait.as_secs_f64().ceil()
                    );
                }
            }
        }
        if let Err(f) = &result {
            tracing::warn!("fault {}: {}", f.code, f.message);
        }
        res.content_type("text/xml; charset=utf-8");
        res.write_all(response_xml(&result).as_bytes())
    }
}

fn plain(res: &mut HttpResponse<'_>, status: u16, text: &str) -> io::Result<()> {
    res.status(status).content_type("text/plain; charset=utf-8");
    res.write_all(text.as_bytes())
}

/// How much longer than a command's timeout and its drain ([`DRAIN_AFTER_KILL`]) a worker
/// waits for its helper's answer: the helper's own work around the command (the fork,
/// the reap, the leftovers' kill) on a loaded machine.
const CALL_MARGIN: Duration = Duration::from_secs(10);

impl RunAs {
    fn call(&self, conn: &appsrv::Conn<'_>, method: &str, params: &[Value]) -> Result<Value, Fault> {
        match method {
            "run" => self.run(conn, params),
            other => {
                let shown: String = other.chars().take(64).collect();
                Err(Fault::new(FAULT_METHOD, format!("unknown method: {shown:?}")))
            }
        }
    }

    /// `run(token, user, command, args)`: checked here, then asked of the helper, which
    /// checks again and runs it.
    fn run(&self, conn: &appsrv::Conn<'_>, params: &[Value]) -> Result<Value, Fault> {
        const SIGNATURE: &str = "run(token, user, command, args) takes three strings and an array of strings";
        let [
            Value::Str(token),
            Value::Str(user),
            Value::Str(command),
            Value::Array(args),
        ] = params
        else {
            let got: Vec<&str> = params.iter().map(Value::type_name).collect();
            return Err(Fault::new(
                FAULT_PARAMS,
                format!("invalid params: {SIGNATURE}, not ({})", got.join(", ")),
            ));
        };
        let args: Vec<&str> = args
            .iter()
            .enumerate()
            .map(|(i, a)| match a {
                Value::Str(s) => Ok(s.as_str()),
                other => Err(Fault::new(
                    FAULT_PARAMS,
                    format!(
                        "invalid params: {SIGNATURE}; args[{i}] is of type {}",
                        other.type_name()
                    ),
                )),
            })
            .collect::<Result<_, _>>()?;
        // The worker's check answers what the policy refuses without a round trip to the
        // helper; the helper's check is the one that counts.
        if !self.unchecked {
            self.policy.check(token, user, command, &args)?;
        }
        let mut helper = conn.privileged::<RunHelper>();
        if let Some(rule) = self.policy.commands.get(command.as_str()) {
            helper = helper.timeout(rule.timeout + DRAIN_AFTER_KILL + CALL_MARGIN);
        }
        let request = Request::Run {
            token: token.clone(),
            user: user.clone(),
            command: command.clone(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
        };
        match helper.call(&request) {
            Ok(Ok(ran)) => Ok(ran.into_value()),
            // The helper's refusal (its check failed) or the command's failure to start:
            // the fault as the helper wrote it.
            Ok(Err(fault)) => Err(fault),
            // The helper is gone (the worker stops after this connection and the master
            // replaces it, with a new helper), did not answer in time, or could not read
            // the request: the command did not run, or its outcome is lost.
            Err(e) => {
                let shown: String = command.chars().take(64).collect();
                tracing::error!("run {shown:?} as {user:?}: {e}");
                Err(Fault::new(
                    FAULT_EXEC,
                    format!("could not run command {shown:?}: {e}"),
                ))
            }
        }
    }
}
