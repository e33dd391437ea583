//! What a server of each kind accepts on its command line: the options its help lists
//! ([`Accepts`]).

use clap::Command;

/// What a program's handler takes, as far as the options go: a program's help, man page
/// and completions list only the options it accepts (issue 34: `hello`'s listed `--io`,
/// `--fronts` and the datagram options, which `hello` refuses or ignores).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Accepts {
    /// A request-level handler (a codec frames requests).
    pub(crate) request_level: bool,
    /// An async handler (event workers only).
    pub(crate) asynchronous: bool,
    /// A datagram handler.
    pub(crate) datagrams: bool,
    /// Stream connections (not a datagram-only server).
    pub(crate) streams: bool,
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
