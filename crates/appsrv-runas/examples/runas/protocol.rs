//! The `runas` example's helper protocol: what a worker may ask of its privileged helper
//! (`Request`) and what the helper answers (`Ran`, or a `Fault`), the types that cross the
//! channel between them (appsrv serialises them; see `appsrv::privileged`).
//!
//! It is a module of its own because it is the trust boundary written down: one typed
//! operation with the client's words (a command *name*, a user *name*, the arguments and
//! the token), never a program path or a command line, so that a worker made to ask for
//! anything can ask only for what the helper's own policy then checks.

use serde::{Deserialize, Serialize};

use crate::xmlrpc::Value;

/// What a worker may ask of its helper: one operation, with the client's words, never a
/// program path or a command line (the helper finds the program in its own policy).
#[derive(Serialize, Deserialize)]
pub(crate) enum Request {
    /// Runs the policy's command named `command` as `user` with `args`, if the policy
    /// allows it with `token`.
    Run {
        token: String,
        user: String,
        command: String,
        args: Vec<String>,
    },
}

/// How a command ended, as the helper reports it.
#[derive(Serialize, Deserialize)]
pub(crate) struct Ran {
    /// The exit code, -1 when a signal ended the command.
    pub(crate) status: i32,
    /// The signal that ended it, 0 if none.
    pub(crate) signal: i32,
    pub(crate) timed_out: bool,
    /// The first [`OUTPUT_CAP`](crate::exec::OUTPUT_CAP) bytes of each.
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    pub(crate) stdout_truncated: bool,
    pub(crate) stderr_truncated: bool,
}

impl Ran {
    pub(crate) fn into_value(self) -> Value {
        let text = |b: &[u8]| Value::Str(String::from_utf8_lossy(b).into_owned());
        Value::Struct(vec![
            ("status".into(), Value::Int(self.status.into())),
            ("signal".into(), Value::Int(self.signal.into())),
            ("timed_out".into(), Value::Bool(self.timed_out)),
            ("stdout".into(), text(&self.stdout)),
            ("stderr".into(), text(&self.stderr)),
            ("stdout_truncated".into(), Value::Bool(self.stdout_truncated)),
            ("stderr_truncated".into(), Value::Bool(self.stderr_truncated)),
        ])
    }
}
