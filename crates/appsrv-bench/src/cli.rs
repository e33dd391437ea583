//! The command line. The names of the options are a contract: scripts rely on them.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, CommandFactory, Parser, ValueEnum};

use crate::escape::unescape;
use crate::framing::Framing;
use crate::net::check_addr;

const ABOUT: &str = "Load generator for appsrv servers (and any request/response protocol over \
                     TCP or Unix sockets): reports requests/s, transfer rate, errors and latency";

const AFTER_HELP: &str = "\
Defaults: 1 connection, -n 1000 (unless -d), no warm-up, keep-alive, pipeline 1, no request (the \
server speaks first), no rate limit, --timeout 10, text report, progress only on a terminal.

Response framing: --until, --response-len, --length-prefix, or --http (status line, headers, then \
Content-Length, chunked, or until the close). With none of them, --reconnect reads each response \
until the server closes the connection; keep-alive needs one of them.

Latency is measured from the start of the request (including the connect when it needs a new \
connection; with --rate, from the moment the request was due) to its complete response, in \
microseconds. Errors: connect (cannot open a connection within --timeout), reset (reset or broken connection), \
timeout, bad_response (malformed, or the connection closed before the response was complete), \
other (any other I/O error). After an error the connection is closed and a new one opened.

--json prints one object: target, connections, keep_alive, pipeline, rate (null if none), \
warmup_s, duration_s, requests (completed), requests_per_s, bytes_read, bytes_read_per_s, errors \
{connect, reset, timeout, bad_response, other}, errors_total, unfinished (in progress when a -d run \
ended), non_2xx_3xx (HTTP), connects (connections opened), warmup_requests (completed during the \
warm-up, not counted elsewhere), silent_connections (connections that got no response at all), \
latency_us {min, mean, p50, p90, p99, p99_9, max, stdev} (null when no request completed).

Exit status: 0 when the run completed (even with errors counted), 2 for bad usage, 1 for a fatal \
problem (ADDR cannot be resolved, the request file cannot be read, a thread cannot be started).";

/// Bytes given as text with escapes.
#[derive(Debug, Clone)]
pub(crate) struct Escaped(pub(crate) Vec<u8>);

fn escaped(s: &str) -> Result<Escaped, String> {
    unescape(s).map(Escaped)
}

fn secs(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(0.0..=31_536_000.0).contains(&v) {
        return Err(format!("{s} is out of range (0 to one year)"));
    }
    Ok(Duration::from_secs_f64(v))
}

fn positive_secs(s: &str) -> Result<Duration, String> {
    let d = secs(s)?;
    if d.is_zero() {
        return Err("must be more than 0".to_string());
    }
    Ok(d)
}

fn positive_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("{s:?} is not a number"))?;
    if !(0.001..=1e9).contains(&v) {
        return Err("must be from 0.001 to 1e9 requests per second".to_string());
    }
    Ok(v)
}

/// The width of a `--length-prefix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PrefixWidth {
    /// Two bytes, big-endian.
    U16,
    /// Four bytes, big-endian.
    U32,
}

#[derive(Debug, Parser)]
#[command(name = "appsrv-bench", version, about = ABOUT, after_help = AFTER_HELP)]
#[command(group(ArgGroup::new("request_source").args(["request", "request_file", "http"])))]
#[command(group(ArgGroup::new("framing").args(["until", "response_len", "length_prefix"])))]
pub(crate) struct Args {
    /// Server address: HOST:PORT (resolved once, at start) or unix:/PATH
    #[arg(value_name = "ADDR", value_parser = check_addr)]
    pub(crate) addr: String,

    /// Concurrent connections, each with its own thread
    #[arg(short = 'c', long = "connections", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) connections: u32,

    /// Total requests after the warm-up, spread evenly over the connections [default: 1000
    /// unless -d is given]
    #[arg(short = 'n', long = "requests", value_name = "N", conflicts_with = "duration",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) requests: Option<u64>,

    /// Run for SECS seconds after the warm-up instead of a number of requests [default: none,
    /// -n 1000]
    #[arg(short = 'd', long = "duration", value_name = "SECS", value_parser = positive_secs)]
    pub(crate) duration: Option<Duration>,

    /// Send requests for SECS seconds first, without counting them
    #[arg(long, value_name = "SECS", default_value = "0", value_parser = secs)]
    pub(crate) warmup: Duration,

    /// Open a new connection for each request, closed after the response [default: keep-alive,
    /// each connection sends its requests one after another]
    #[arg(long)]
    pub(crate) reconnect: bool,

    /// Send N requests on a connection before reading their N responses
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub(crate) pipeline: u32,

    /// The request, with escapes \r \n \t \\ \0 \xHH [default: no request: read what the server
    /// sends first]
    #[arg(long, value_name = "TEXT", value_parser = escaped)]
    pub(crate) request: Option<Escaped>,

    /// The request: the bytes of the file PATH, as they are
    #[arg(long, value_name = "PATH")]
    pub(crate) request_file: Option<PathBuf>,

    /// Send `GET PATH HTTP/1.1` with `Host: ADDR` (and `Connection: close` with --reconnect),
    /// and read HTTP/1.1 responses
    #[arg(long, value_name = "PATH", conflicts_with = "framing")]
    pub(crate) http: Option<String>,

    /// A response ends after TEXT (escapes as in --request)
    #[arg(long, value_name = "TEXT", value_parser = escaped)]
    pub(crate) until: Option<Escaped>,

    /// A response is N bytes long
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) response_len: Option<u64>,

    /// A response is a big-endian length of this width, then that many bytes
    #[arg(long, value_name = "WIDTH")]
    pub(crate) length_prefix: Option<PrefixWidth>,

    /// Send N requests per second in all, spread evenly over the connections [default: as
    /// fast as the server answers]
    #[arg(long, value_name = "N", value_parser = positive_rate)]
    pub(crate) rate: Option<f64>,

    /// A read or write that waits longer than SECS, or a request that takes longer in all
    /// (checked between reads), fails with a timeout error; a connect, with a connect error
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = positive_secs)]
    pub(crate) timeout: Duration,

    /// Print a progress line on stderr every second of a run longer than 2 s [default: only
    /// when stderr is a terminal]
    #[arg(long)]
    pub(crate) progress: bool,

    /// Print the report as one JSON object (its fields are listed below)
    #[arg(long)]
    pub(crate) json: bool,
}

impl Args {
    /// Parses the command line; exits with status 2 on bad usage (0 for --help, --version).
    pub(crate) fn parse_checked() -> Args {
        let args = Args::parse();
        if let Err(msg) = args.check() {
            Args::command()
                .error(clap::error::ErrorKind::ArgumentConflict, msg)
                .exit();
        }
        args
    }

    /// The checks that clap's attributes cannot express.
    fn check(&self) -> Result<(), String> {
        if self.reconnect && self.pipeline > 1 {
            return Err(
                "--pipeline needs keep-alive: with --reconnect a connection carries one request".into(),
            );
        }
        if !self.reconnect && self.http.is_none() && self.framing().is_none() {
            return Err(
                "without --reconnect, tell where a response ends: --until, --response-len, \
                        --length-prefix or --http"
                    .into(),
            );
        }
        if self.until.as_ref().is_some_and(|u| u.0.is_empty()) {
            return Err("--until needs at least one byte".into());
        }
        if let Some(path) = &self.http {
            if path.is_empty()
                || path
                    .bytes()
                    .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
            {
                return Err(format!(
                    "--http {path:?}: a path without spaces or control characters"
                ));
            }
        }
        Ok(())
    }

    /// The framing given by --until, --response-len, --length-prefix or --http.
    pub(crate) fn framing(&self) -> Option<Framing> {
        if self.http.is_some() {
            Some(Framing::Http)
        } else if let Some(u) = &self.until {
            Some(Framing::Until(u.0.clone()))
        } else if let Some(n) = self.response_len {
            Some(Framing::Fixed(n))
        } else {
            self.length_prefix.map(|w| {
                Framing::Prefix(match w {
                    PrefixWidth::U16 => 2,
                    PrefixWidth::U32 => 4,
                })
            })
        }
    }

    /// The HTTP request of `--http PATH`.
    pub(crate) fn http_request(&self, path: &str) -> Vec<u8> {
        // A Unix socket has no host name; HTTP/1.1 needs a Host all the same.
        let host = if self.addr.starts_with("unix:") {
            "localhost"
        } else {
            &self.addr
        };
        let close = if self.reconnect {
            "Connection: close\r\n"
        } else {
            ""
        };
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{close}\r\n").into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        let args = Args::try_parse_from(std::iter::once("appsrv-bench").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        args.check()?;
        Ok(args)
    }

    #[test]
    fn clap_definition_is_valid() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let a = parse(&["127.0.0.1:1", "--until", "\\n"]).unwrap();
        assert_eq!(a.connections, 1);
        assert_eq!(a.requests, None);
        assert_eq!(a.duration, None);
        assert_eq!(a.warmup, Duration::ZERO);
        assert!(!a.reconnect);
        assert_eq!(a.pipeline, 1);
        assert_eq!(a.timeout, Duration::from_secs(10));
        assert_eq!(a.framing(), Some(Framing::Until(b"\n".to_vec())));
    }

    #[test]
    fn usage_errors() {
        assert!(
            parse(&["127.0.0.1:1"])
                .unwrap_err()
                .contains("where a response ends")
        );
        assert!(parse(&["127.0.0.1:1", "--reconnect"]).is_ok());
        assert!(parse(&["127.0.0.1:1", "--reconnect", "--pipeline", "2"]).is_err());
        assert!(parse(&["127.0.0.1:1", "--until", "x", "-n", "5", "-d", "1"]).is_err());
        assert!(parse(&["127.0.0.1:1", "--until", "x", "--response-len", "5"]).is_err());
        assert!(parse(&["127.0.0.1:1", "--http", "/", "--until", "x"]).is_err());
        assert!(parse(&["127.0.0.1:1", "--http", "/", "--request", "x"]).is_err());
        assert!(parse(&["127.0.0.1:1", "--until", "\\q"]).is_err());
        assert!(parse(&["127.0.0.1:1", "--until", ""]).is_err());
        assert!(parse(&["127.0.0.1:1", "--until", "x", "-c", "0"]).is_err());
        assert!(parse(&["127.0.0.1:1", "--until", "x", "--timeout", "0"]).is_err());
        assert!(parse(&["127.0.0.1:1", "--until", "x", "--rate", "-1"]).is_err());
        assert!(parse(&["127.0.0.1", "--until", "x"]).is_err());
        assert!(parse(&["127.0.0.1:1", "--http", "/a b"]).is_err());
    }

    #[test]
    fn http_request() {
        let a = parse(&["localhost:8080", "--http", "/x?y"]).unwrap();
        assert_eq!(
            a.http_request("/x?y"),
            b"GET /x?y HTTP/1.1\r\nHost: localhost:8080\r\n\r\n"
        );
        let a = parse(&["unix:/s", "--http", "/", "--reconnect"]).unwrap();
        assert_eq!(
            a.http_request("/"),
            b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn length_prefix_widths() {
        let a = parse(&["h:1", "--length-prefix", "u16"]).unwrap();
        assert_eq!(a.framing(), Some(Framing::Prefix(2)));
        let a = parse(&["h:1", "--length-prefix", "u32"]).unwrap();
        assert_eq!(a.framing(), Some(Framing::Prefix(4)));
        assert!(parse(&["h:1", "--length-prefix", "u8"]).is_err());
    }
}
