//! What a server of each kind accepts on its command line ([`Accepts`]): the options its
//! help lists, the I/O model it runs, and the configuration checks that `check` and a
//! start make before anything is bound (issue 43 moved them here from `dispatch`).

use clap::Command;

use super::config::Config;
use super::{Io, PoolKind};
use crate::error::{Error, Result};
use crate::net::listener::ListenAddr;

/// What kind of server a program is, as far as its command line goes: the options it
/// takes (a program's help, man page and completions list only those; issue 34: `hello`'s
/// listed `--io`, `--fronts` and the datagram options, which `hello` refuses or ignores),
/// the I/O model it runs ([`io_model`](Accepts::io_model)) and the configuration it
/// accepts ([`check_io`](Accepts::check_io)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Accepts {
    /// A request-level handler (a codec frames requests).
    pub(crate) request_level: bool,
    /// An async handler (async workers only).
    pub(crate) asynchronous: bool,
    /// A datagram handler.
    pub(crate) datagrams: bool,
    /// Stream connections (not a datagram-only server).
    pub(crate) streams: bool,
    /// The request handler's `Session` holds state (hybrid mode cannot serve it).
    pub(crate) stateful_sessions: bool,
}

impl Accepts {
    /// Whether a server of this kind takes the serving option `id`.
    fn takes(self, id: &str) -> bool {
        let sync_requests = self.request_level && !self.asynchronous;
        match id {
            // The I/O model: blocking, event or hybrid for a synchronous request-level
            // handler, async (or its alias, event) for an async one (issue 43: its help
            // names the model it runs); the others have one model each.
            "io" => sync_requests || self.asynchronous,
            "fronts" => sync_requests,
            "worker-connections" | "max-buffered-bytes" => {
                self.request_level || self.asynchronous || self.datagrams
            }
            "max-inflight" => self.asynchronous,
            "max-requests" | "keepalive-timeout" | "keepalive-requests" | "header-timeout"
            | "header-timeout-max" | "min-rate" => self.request_level && self.streams,
            "max-answers-per-ip"
            | "answers-slip"
            | "answers-ipv4-prefix"
            | "answers-ipv6-prefix"
            | "max-datagram-size"
            | "access-log-sample" => self.datagrams,
            "max-conns-per-ip"
            | "proxy-protocol"
            | "proxy-from"
            | "tls-cert"
            | "tls-key"
            | "tls-client-ca"
            | "tls-alpn"
            | "tls-handshake-timeout"
            | "tls-ticket-lifetime"
            | "min-send-rate"
            | "max-connections" => self.streams,
            _ => true,
        }
    }

    /// The I/O model a server runs: `--io` as given (on the command line, in the environment
    /// or by `Server::io`), except where the server's kind decides:
    /// - a datagram-only server has no stream connections for --io to choose a model for: its
    ///   datagrams are served from the event loop;
    /// - an async handler runs in async workers: that is its default, also when the command
    ///   line was parsed (`Server::args`) before the handler's kind was known, and `event`
    ///   is its alias (async handlers ran under that name before issue 43 named their model);
    /// - datagrams beside streams are served from the event loop: a request-level server given
    ///   both runs it by default (issue 34).
    ///
    /// A model given explicitly stays otherwise, to be refused with the flag that would serve.
    pub(crate) fn io_model(self, listen: &[ListenAddr], io: Io, io_given: bool) -> Io {
        let datagram_only = !self.streams;
        let mixed = listen.iter().any(ListenAddr::is_datagram) && listen.iter().any(|a| !a.is_datagram());
        let framework_default = !io_given && io == Io::Blocking;
        if datagram_only || (framework_default && self.request_level && mixed && !self.asynchronous) {
            Io::Event
        } else if self.asynchronous && (!io_given || io == Io::Event) {
            Io::Async
        } else {
            io
        }
    }

    /// What `--io` asks of the server and the rest of the configuration, checked before
    /// start: `async` an async handler; `event` a request-level handler and no privileged
    /// helper (but for an async handler); both a static pool and descriptors for
    /// `--worker-connections`. Also that a server with a privileged helper starts as root.
    pub(crate) fn check_io(self, config: &Config) -> Result<()> {
        let (request_level, asynchronous) = (self.request_level, self.asynchronous);
        if config.workers.io == Io::Async && !asynchronous {
            return Err(not_async(request_level));
        }
        check_datagrams(config, self, request_level || asynchronous)?;
        if asynchronous {
            check_async(config, request_level, self.datagrams)?;
        }
        if config.confine.helper_profile.is_some() && !nix::unistd::Uid::effective().is_root() {
            return Err(Error::Config(
                "this server has a privileged helper (Server::privileged), which keeps root's capabilities for its workers: start it as root".into(),
            ));
        }
        if config.workers.io == Io::Hybrid {
            return check_hybrid(config, request_level, self.stateful_sessions);
        }
        if !matches!(config.workers.io, Io::Event | Io::Async) {
            return Ok(());
        }
        // An async handler awaits its calls (`Helper::call_async`); a request handler of the
        // event loop could only block it.
        if config.confine.helper_profile.is_some() && !asynchronous {
            return Err(Error::Config(
                "--io event: this server has a privileged helper (Server::privileged), whose calls block the worker: it runs with --io blocking only (or with an async handler, which awaits Helper::call_async)".into(),
            ));
        }
        if !request_level && !asynchronous {
            return Err(Error::Config(
                "--io event: this server's handler takes whole connections (handle_client), which block; it runs with --io blocking only (an AsyncHandler, Server::run_async, serves whole connections in async workers)".into(),
            ));
        }
        if config.pool.policy != PoolKind::Static {
            // The dynamic and ondemand pools size themselves by idle workers, and an event
            // (or async) worker is never idle: it holds many connections at once.
            return Err(Error::Config(format!(
                "--io {io} --pool {}: {io} workers each serve up to --worker-connections clients, so their pool is static: give --workers N (default: the number of CPUs) instead",
                match config.pool.policy {
                    PoolKind::Dynamic => "dynamic",
                    _ => "ondemand",
                },
                io = config.workers.io.name(),
            )));
        }
        if config.workers.worker_connections == 0 {
            return Err(Error::Config(
                "--worker-connections 0: expected at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// Hides from `run`'s, `start`'s and `check`'s help (and the top level's, which is
/// `run`'s) the serving options a server of kind `accepts` does not take. They are still
/// parsed, so that one given anyway is refused with a message that says why.
pub(crate) fn only_accepted(cmd: Command, accepts: Accepts) -> Command {
    let hide = |c: Command| {
        c.mut_args(|a| {
            if accepts.takes(a.get_id().as_str()) {
                a
            } else {
                a.hide(true)
            }
        })
    };
    hide(cmd).mut_subcommands(|sub| match sub.get_name() {
        "run" | "start" | "check" => hide(sub),
        _ => sub,
    })
}

/// The refusal of `--io async` for a server whose handler is not async (issue 43).
fn not_async(request_level: bool) -> Error {
    let (run, models) = if request_level {
        ("run_requests", "--io blocking, event or hybrid")
    } else {
        ("run", "--io blocking only")
    };
    Error::Config(format!(
        "--io async: this server's handler is not async (Server::{run}): the async model runs the async handlers of Server::run_async_requests and Server::run_async; it runs with {models}"
    ))
}

/// What an async handler asks of the configuration (issue 33): async workers (`--io
/// async`, or its alias `event`), whose runtime holds its requests while they wait, and
/// no datagram listener (the async driver serves streams only).
fn check_async(config: &Config, request_level: bool, datagram_handler: bool) -> Result<()> {
    let run = if request_level {
        "run_async_requests"
    } else {
        "run_async"
    };
    if config.workers.io != Io::Async {
        return Err(Error::Config(format!(
            "--io {}: this server's handler is async (Server::{run}): its requests wait in the runtime of async workers, so it runs with --io async only (its default; --io event is accepted as its alias)",
            config.workers.io.name()
        )));
    }
    if datagram_handler || config.listeners.listen.iter().any(|a| a.is_datagram()) {
        return Err(Error::Config(format!(
            "this server's handler is async (Server::{run}), and async workers serve stream listeners only: serve datagrams from another server (Server::run_datagrams)"
        )));
    }
    Ok(())
}

/// What `--io hybrid` asks of the server and its configuration.
fn check_hybrid(config: &Config, request_level: bool, stateful_sessions: bool) -> Result<()> {
    if !request_level {
        return Err(Error::Config(
            "--io hybrid: this server's handler takes whole connections (handle_client), and appsrv cannot tell when such a connection has a whole request to hand over; it runs with --io blocking only (--max-conns-per-ip keeps one client from taking every worker)".into(),
        ));
    }
    if stateful_sessions {
        return Err(Error::Config(
            "--io hybrid: this handler keeps state per connection (its RequestHandler::Session is not ()), which cannot follow a connection handed between processes; use --io blocking or --io event".into(),
        ));
    }
    if config.workers.exec_workers {
        return Err(Error::Config(
            "--io hybrid does not work with --exec-workers yet: use one or the other".into(),
        ));
    }
    if config.workers.fronts == 0 || config.workers.fronts > 64 {
        return Err(Error::Config(format!(
            "--fronts {}: expected 1 to 64",
            config.workers.fronts
        )));
    }
    if config.workers.worker_connections == 0 {
        return Err(Error::Config(
            "--worker-connections 0: expected at least 1".into(),
        ));
    }
    Ok(())
}

/// What datagram listeners ask of the server: a datagram handler, and the event loop
/// that serves them (beside stream connections, only with `--io event`); a datagram-only
/// server has no stream listener. Sockets from systemd are checked by the workers, which
/// refuse to start with a datagram socket and no handler.
fn check_datagrams(config: &Config, d: Accepts, event_capable: bool) -> Result<()> {
    let dgram = config.listeners.listen.iter().find(|a| a.is_datagram());
    let stream = config.listeners.listen.iter().find(|a| !a.is_datagram());
    if let (Some(a), false) = (dgram, d.datagrams) {
        return Err(Error::Config(format!(
            "{a} is a datagram listener, and this server has no datagram handler (Server::datagrams): it serves streams only"
        )));
    }
    if !d.streams {
        if let Some(a) = stream {
            return Err(Error::Config(format!(
                "{a} is a stream listener, and this server serves datagrams only: give udp://HOST:PORT or unixgram:PATH"
            )));
        }
        if !config.listeners.listen.is_empty() && dgram.is_none() {
            return Err(Error::Config(
                "this server serves datagrams only: give a udp://HOST:PORT or unixgram:PATH listener".into(),
            ));
        }
    }
    if let (Some(a), Some(_), false) = (dgram, stream, event_capable) {
        return Err(Error::Config(format!(
            "{a}: datagrams beside stream connections are served from the event loop, and this server's handler takes whole connections (handle_client), which run with --io blocking only: serve the datagrams from a server of their own (Server::run_datagrams)"
        )));
    }
    let event_loop = matches!(config.workers.io, Io::Event | Io::Async);
    if let (Some(a), Some(_), false) = (dgram, stream, event_loop) {
        return Err(crate::net::listener::mixed_needs_event_loop(
            a.as_str(),
            config.workers.io.name(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's kind as far as its I/O model goes.
    fn kind(request_level: bool, asynchronous: bool, datagram_only: bool) -> Accepts {
        Accepts {
            request_level,
            asynchronous,
            datagrams: datagram_only,
            streams: !datagram_only,
            stateful_sessions: false,
        }
    }

    /// Issue 34: a request-level server with stream and datagram listeners runs the event
    /// loop when no model was chosen; a model chosen stays (to be refused by name).
    #[test]
    fn issue_34_datagrams_beside_streams_run_the_event_loop_by_default() {
        let listen: Vec<ListenAddr> = ["127.0.0.1:0", "udp://127.0.0.1:0"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let requests = kind(true, false, false);
        use super::super::Io::{Async, Blocking, Event, Hybrid};
        assert_eq!(requests.io_model(&listen, Blocking, false), Event);
        assert_eq!(
            requests.io_model(&listen, Blocking, true),
            Blocking,
            "--io blocking given"
        );
        assert_eq!(
            requests.io_model(&listen, Hybrid, false),
            Hybrid,
            "Server::io(Hybrid)"
        );
        assert_eq!(
            requests.io_model(&listen[..1], Blocking, false),
            Blocking,
            "streams only"
        );
        assert_eq!(
            kind(false, false, false).io_model(&listen, Blocking, false),
            Blocking,
            "handle_client"
        );
        let async_kind = kind(false, true, false);
        assert_eq!(async_kind.io_model(&listen[..1], Blocking, false), Async);
        assert_eq!(
            async_kind.io_model(&listen[..1], Hybrid, true),
            Hybrid,
            "refused later"
        );
        let dgram_only = kind(true, false, true);
        assert_eq!(dgram_only.io_model(&listen[1..], Blocking, true), Event);
    }

    /// Issue 43: an async server runs the async model, named so: by default (also when its
    /// options were parsed before its kind was known, with the framework's `blocking`
    /// default), given `--io async`, and given `--io event`, its alias; `blocking` and
    /// `hybrid` given stay, to be refused by `check_async`; a synchronous server given
    /// `async` keeps it, to be refused by `not_async`.
    #[test]
    fn issue_43_async_servers_run_the_async_model_and_event_is_its_alias() {
        use super::super::Io::{Async, Blocking, Event, Hybrid};
        let tcp: Vec<ListenAddr> = vec!["127.0.0.1:0".parse().unwrap()];
        let async_kind = |request_level| kind(request_level, true, false);
        for kind in [async_kind(true), async_kind(false)] {
            assert_eq!(kind.io_model(&tcp, Blocking, false), Async, "the default");
            assert_eq!(kind.io_model(&tcp, Async, false), Async, "run_async's default");
            assert_eq!(kind.io_model(&tcp, Async, true), Async, "--io async");
            assert_eq!(kind.io_model(&tcp, Event, true), Async, "--io event, the alias");
            assert_eq!(kind.io_model(&tcp, Blocking, true), Blocking, "refused later");
            assert_eq!(kind.io_model(&tcp, Hybrid, true), Hybrid, "refused later");
        }
        let sync_requests = kind(true, false, false);
        assert_eq!(sync_requests.io_model(&tcp, Async, true), Async, "refused later");
        let e = not_async(true).to_string();
        assert!(
            e.contains("--io async") && e.contains("Server::run_requests"),
            "{e}"
        );
        let e = not_async(false).to_string();
        assert!(
            e.contains("--io async") && e.contains("--io blocking only"),
            "{e}"
        );
    }
}
