//! appsrv-bench against scripted servers: what it counts, how it frames responses, how it
//! fails. The servers run in threads of the test, on 127.0.0.1:0 or a fresh Unix socket.

mod support;

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use support::{Conn, Server, bench, bench_json, drain, errors, for_each_message, int, read_message};

const ERROR_KINDS: [&str; 5] = ["connect", "reset", "timeout", "bad_response", "other"];

/// A line echo server that counts the lines it answers.
fn echo_server(tcp: bool) -> (Server, Arc<AtomicUsize>) {
    let lines = Arc::new(AtomicUsize::new(0));
    let counter = lines.clone();
    let handler = move |conn: &mut dyn Conn| {
        for_each_message(conn, b"\n", |line, conn| {
            counter.fetch_add(1, Ordering::SeqCst);
            conn.write_all(line)
        })
    };
    let server = if tcp {
        Server::tcp(handler)
    } else {
        Server::unix(handler)
    };
    (server, lines)
}

fn assert_no_errors(report: &serde_json::Value) {
    for kind in ERROR_KINDS {
        assert_eq!(errors(report, kind), 0, "errors.{kind} in {report}");
    }
    assert_eq!(int(report, "errors_total"), 0, "{report}");
    assert_eq!(int(report, "unfinished"), 0, "{report}");
}

#[test]
fn counts_requests_errors_and_bytes_exactly() {
    let (server, lines) = echo_server(true);
    let r = bench_json(&[
        server.addr(),
        "-n",
        "100",
        "-c",
        "4",
        "--request",
        r"ping\n",
        "--until",
        r"\n",
    ]);
    assert_eq!(int(&r, "requests"), 100, "{r}");
    assert_no_errors(&r);
    assert_eq!(int(&r, "bytes_read"), 500, "{r}");
    assert_eq!(int(&r, "connects"), 4, "{r}");
    assert_eq!(int(&r, "connections"), 4, "{r}");
    assert_eq!(int(&r, "warmup_requests"), 0, "{r}");
    assert_eq!(int(&r, "silent_connections"), 0, "{r}");
    assert_eq!(r["keep_alive"], true);
    assert_eq!(int(&r, "pipeline"), 1);
    assert!(r["rate"].is_null());
    let duration = r["duration_s"].as_f64().expect("duration_s");
    assert!(duration > 0.0, "{r}");
    let rps = r["requests_per_s"].as_f64().expect("requests_per_s");
    assert!((rps - 100.0 / duration).abs() < 1e-6 * rps, "{r}");
    let bps = r["bytes_read_per_s"].as_f64().expect("bytes_read_per_s");
    assert!((bps - 500.0 / duration).abs() < 1e-6 * bps, "{r}");
    let lat = &r["latency_us"];
    let q = |k: &str| lat[k].as_u64().unwrap_or_else(|| panic!("latency_us.{k} in {r}"));
    assert!(
        q("min") <= q("p50") && q("p50") <= q("p90") && q("p90") <= q("p99"),
        "{r}"
    );
    assert!(q("p99") <= q("p99_9") && q("p99_9") <= q("max"), "{r}");
    assert!(
        lat["mean"].as_f64().is_some() && lat["stdev"].as_f64().is_some(),
        "{r}"
    );
    assert_eq!(server.stop(), 4);
    assert_eq!(lines.load(Ordering::SeqCst), 100);
}

#[test]
fn json_has_every_documented_field() {
    let (server, _) = echo_server(true);
    let r = bench_json(&[server.addr(), "-n", "3", "--request", r"x\n", "--until", r"\n"]);
    let fields = [
        "target",
        "connections",
        "keep_alive",
        "pipeline",
        "rate",
        "warmup_s",
        "duration_s",
        "requests",
        "requests_per_s",
        "bytes_read",
        "bytes_read_per_s",
        "errors",
        "errors_total",
        "unfinished",
        "non_2xx_3xx",
        "connects",
        "warmup_requests",
        "silent_connections",
        "latency_us",
    ];
    let obj = r.as_object().expect("object");
    for f in fields {
        assert!(obj.contains_key(f), "{f} missing in {r}");
    }
    assert_eq!(obj.len(), fields.len(), "undocumented fields in {r}");
    assert_eq!(r["target"], server.addr());
    let latency: Vec<&str> = r["latency_us"]
        .as_object()
        .expect("latency_us")
        .keys()
        .map(String::as_str)
        .collect();
    for k in ["min", "mean", "p50", "p90", "p99", "p99_9", "max", "stdev"] {
        assert!(latency.contains(&k), "latency_us.{k} missing in {r}");
    }
    let kinds: Vec<&str> = r["errors"]
        .as_object()
        .expect("errors")
        .keys()
        .map(String::as_str)
        .collect();
    for k in ERROR_KINDS {
        assert!(kinds.contains(&k), "errors.{k} missing in {r}");
    }
}

#[test]
fn pipelining_sends_batches_on_each_connection() {
    let (server, lines) = echo_server(true);
    let r = bench_json(&[
        server.addr(),
        "-n",
        "100",
        "-c",
        "3",
        "--pipeline",
        "8",
        "--request",
        r"ping\n",
        "--until",
        r"\n",
    ]);
    assert_eq!(int(&r, "requests"), 100, "{r}");
    assert_no_errors(&r);
    assert_eq!(int(&r, "bytes_read"), 500, "{r}");
    assert_eq!(server.stop(), 3);
    assert_eq!(lines.load(Ordering::SeqCst), 100);
}

#[test]
fn delimiter_split_across_writes() {
    let server = Server::tcp(|conn| {
        for_each_message(conn, b"\n", |_, conn| {
            conn.write_all(b"he\r")?;
            conn.write_all(b"\nllo\r\n\r")?;
            conn.write_all(b"\n")
        })
    });
    let r = bench_json(&[
        server.addr(),
        "-n",
        "50",
        "-c",
        "2",
        "--request",
        r"q\n",
        "--until",
        r"\r\n\r\n",
    ]);
    assert_eq!(int(&r, "requests"), 50, "{r}");
    assert_no_errors(&r);
    assert_eq!(int(&r, "bytes_read"), 50 * 11, "{r}");
}

#[test]
fn fixed_length_responses() {
    let server = Server::tcp(|conn| {
        for_each_message(conn, b"\n", |_, conn| {
            conn.write_all(b"0123")?;
            conn.write_all(b"456789")
        })
    });
    let r = bench_json(&[
        server.addr(),
        "-n",
        "40",
        "-c",
        "2",
        "--request",
        r"q\n",
        "--response-len",
        "10",
    ]);
    assert_eq!(int(&r, "requests"), 40, "{r}");
    assert_no_errors(&r);
    assert_eq!(int(&r, "bytes_read"), 400, "{r}");
}

/// A server answering each line with a big-endian length of `width` bytes and 300 bytes.
fn length_prefix_server(width: usize) -> Server {
    Server::tcp(move |conn| {
        for_each_message(conn, b"\n", |_, conn| {
            let prefix = 300u32.to_be_bytes();
            conn.write_all(&prefix[4 - width..4 - width + 1])?;
            conn.write_all(&prefix[4 - width + 1..])?;
            conn.write_all(&[b'a'; 100])?;
            conn.write_all(&[b'b'; 200])
        })
    })
}

#[test]
fn length_prefix_u16() {
    let server = length_prefix_server(2);
    let r = bench_json(&[
        server.addr(),
        "-n",
        "30",
        "-c",
        "2",
        "--request",
        r"q\n",
        "--length-prefix",
        "u16",
    ]);
    assert_eq!(int(&r, "requests"), 30, "{r}");
    assert_no_errors(&r);
    assert_eq!(int(&r, "bytes_read"), 30 * 302, "{r}");
}

#[test]
fn length_prefix_u32() {
    let server = length_prefix_server(4);
    let r = bench_json(&[
        server.addr(),
        "-n",
        "30",
        "-c",
        "2",
        "--request",
        r"q\n",
        "--length-prefix",
        "u32",
    ]);
    assert_eq!(int(&r, "requests"), 30, "{r}");
    assert_no_errors(&r);
    assert_eq!(int(&r, "bytes_read"), 30 * 304, "{r}");
}

/// An HTTP server: checks each request head against the one appsrv-bench should send for
/// `path` (answering 400 if different) and answers it with `respond`. Returns the server
/// and the counts of good and bad requests.
fn http_server_for(
    path: &str,
    close: bool,
    respond: fn(&mut dyn Conn) -> io::Result<()>,
) -> (Server, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    // The expected Host is the server's address, known once it listens.
    let cell = Arc::new(std::sync::OnceLock::<String>::new());
    let expect_cell = cell.clone();
    let path = path.to_string();
    let good = Arc::new(AtomicUsize::new(0));
    let bad = Arc::new(AtomicUsize::new(0));
    let (g, b) = (good.clone(), bad.clone());
    let server = Server::tcp(move |conn| {
        let addr = expect_cell.get().expect("address set before any request");
        let connection = if close { "Connection: close\r\n" } else { "" };
        let expect = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{connection}\r\n");
        for_each_message(conn, b"\r\n\r\n", |head, conn| {
            if head == expect.as_bytes() {
                g.fetch_add(1, Ordering::SeqCst);
                respond(conn)
            } else {
                b.fetch_add(1, Ordering::SeqCst);
                eprintln!("unexpected request: {:?}", String::from_utf8_lossy(head));
                conn.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            }
        })
    });
    cell.set(server.addr().to_string()).expect("set once");
    (server, good, bad)
}

const CL_RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello";

#[test]
fn http_content_length_keep_alive() {
    let (server, good, bad) = http_server_for("/hello", false, |conn| {
        conn.write_all(&CL_RESPONSE[..20])?;
        conn.write_all(&CL_RESPONSE[20..])
    });
    let r = bench_json(&[server.addr(), "-n", "60", "-c", "3", "--http", "/hello"]);
    assert_eq!(int(&r, "requests"), 60, "{r}");
    assert_no_errors(&r);
    assert_eq!(int(&r, "non_2xx_3xx"), 0, "{r}");
    assert_eq!(int(&r, "bytes_read"), 60 * CL_RESPONSE.len() as u64, "{r}");
    assert_eq!(server.stop(), 3);
    assert_eq!((good.load(Ordering::SeqCst), bad.load(Ordering::SeqCst)), (60, 0));
}

const CHUNKED_RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nwiki\r\n5;ext=1\r\npedia\r\n0\r\nX-Trailer: 1\r\n\r\n";

#[test]
fn http_chunked_pipelined() {
    let (server, good, bad) = http_server_for("/chunks", false, |conn| {
        for piece in CHUNKED_RESPONSE.chunks(7) {
            conn.write_all(piece)?;
        }
        Ok(())
    });
    let r = bench_json(&[
        server.addr(),
        "-n",
        "40",
        "-c",
        "2",
        "--pipeline",
        "4",
        "--http",
        "/chunks",
    ]);
    assert_eq!(int(&r, "requests"), 40, "{r}");
    assert_no_errors(&r);
    assert_eq!(int(&r, "bytes_read"), 40 * CHUNKED_RESPONSE.len() as u64, "{r}");
    assert_eq!(server.stop(), 2);
    assert_eq!((good.load(Ordering::SeqCst), bad.load(Ordering::SeqCst)), (40, 0));
}

const TO_CLOSE_RESPONSE: &[u8] = b"HTTP/1.0 200 OK\r\nServer: test\r\n\r\nthe body runs to the close";

#[test]
fn http_read_to_close_with_reconnect() {
    let (server, good, bad) = http_server_for("/", true, |conn| {
        conn.write_all(TO_CLOSE_RESPONSE)?;
        Err(io::Error::other("close the connection"))
    });
    let r = bench_json(&[server.addr(), "-n", "20", "-c", "2", "--http", "/", "--reconnect"]);
    assert_eq!(int(&r, "requests"), 20, "{r}");
    assert_no_errors(&r);
    assert_eq!(int(&r, "bytes_read"), 20 * TO_CLOSE_RESPONSE.len() as u64, "{r}");
    assert_eq!(r["keep_alive"], false);
    assert_eq!(server.stop(), 20);
    assert_eq!((good.load(Ordering::SeqCst), bad.load(Ordering::SeqCst)), (20, 0));
}

#[test]
fn http_error_statuses_are_counted_but_not_errors() {
    let server = Server::tcp(|conn| {
        for_each_message(conn, b"\r\n\r\n", |_, conn| {
            conn.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
        })
    });
    let r = bench_json(&[server.addr(), "-n", "10", "--http", "/x"]);
    assert_eq!(int(&r, "requests"), 10, "{r}");
    assert_no_errors(&r);
    assert_eq!(int(&r, "non_2xx_3xx"), 10, "{r}");
}

#[test]
fn malformed_http_is_a_bad_response() {
    let server = Server::tcp(|conn| {
        for_each_message(conn, b"\r\n\r\n", |_, conn| {
            conn.write_all(b"HTTP/1.1 OK\r\n\r\n")
        })
    });
    let r = bench_json(&[server.addr(), "-n", "5", "--http", "/"]);
    assert_eq!(int(&r, "requests"), 0, "{r}");
    assert_eq!(errors(&r, "bad_response"), 5, "{r}");
    assert_eq!(int(&r, "errors_total"), 5, "{r}");
    assert!(r["latency_us"]["p50"].is_null(), "{r}");
    // After a bad response the connection is dropped and a new one opened.
    assert_eq!(server.stop(), 5);
}

#[test]
fn reconnect_opens_one_connection_per_request() {
    // A greeting server: says hello and closes, without reading anything.
    let server = Server::tcp(|conn| conn.write_all(b"Hello, Client!\n"));
    let r = bench_json(&[server.addr(), "-n", "50", "-c", "3", "--reconnect"]);
    assert_eq!(int(&r, "requests"), 50, "{r}");
    assert_no_errors(&r);
    assert_eq!(int(&r, "bytes_read"), 50 * 15, "{r}");
    assert_eq!(int(&r, "connects"), 50, "{r}");
    assert_eq!(server.stop(), 50);
}

#[test]
fn reconnect_with_a_request_and_framing() {
    let (server, lines) = echo_server(true);
    let r = bench_json(&[
        server.addr(),
        "-n",
        "30",
        "-c",
        "2",
        "--reconnect",
        "--request",
        r"hi\n",
        "--until",
        r"\n",
    ]);
    assert_eq!(int(&r, "requests"), 30, "{r}");
    assert_no_errors(&r);
    assert_eq!(int(&r, "bytes_read"), 90, "{r}");
    assert_eq!(server.stop(), 30);
    assert_eq!(lines.load(Ordering::SeqCst), 30);
}

#[test]
fn closed_mid_response_is_a_bad_response() {
    let server = Server::tcp(|conn| {
        read_message(conn, b"\n")?;
        conn.write_all(b"pi") // and close, before the end of the line
    });
    let r = bench_json(&[server.addr(), "-n", "3", "--request", r"ping\n", "--until", r"\n"]);
    assert_eq!(int(&r, "requests"), 0, "{r}");
    assert_eq!(errors(&r, "bad_response"), 3, "{r}");
    assert_eq!(int(&r, "errors_total"), 3, "{r}");
    assert_eq!(int(&r, "bytes_read"), 6, "{r}");
    assert_eq!(server.stop(), 3);
}

#[test]
fn latency_of_a_slow_server() {
    // Each response comes 30 ms after its request: every latency is at least that (the
    // histogram must keep values beyond its initial range of about 2 ms).
    let server = Server::tcp(|conn| {
        for_each_message(conn, b"\n", |line, conn| {
            std::thread::sleep(Duration::from_millis(30));
            conn.write_all(line)
        })
    });
    let r = bench_json(&[
        server.addr(),
        "-n",
        "6",
        "-c",
        "2",
        "--request",
        r"x\n",
        "--until",
        r"\n",
    ]);
    assert_eq!(int(&r, "requests"), 6, "{r}");
    let lat = &r["latency_us"];
    let q = |k: &str| lat[k].as_u64().unwrap_or_else(|| panic!("latency_us.{k} in {r}"));
    assert!(q("min") >= 30_000, "{r}");
    assert!(q("max") >= q("p50") && q("p50") >= q("min"), "{r}");
    assert!(lat["mean"].as_f64().expect("mean") >= 30_000.0, "{r}");
}

#[test]
fn stalled_server_gives_timeouts_not_a_hang() {
    let server = Server::tcp(drain);
    let r = bench_json(&[
        server.addr(),
        "-n",
        "4",
        "-c",
        "2",
        "--timeout",
        "0.5",
        "--request",
        r"ping\n",
        "--until",
        r"\n",
    ]);
    assert_eq!(int(&r, "requests"), 0, "{r}");
    assert_eq!(errors(&r, "timeout"), 4, "{r}");
    assert_eq!(int(&r, "errors_total"), 4, "{r}");
    assert_eq!(int(&r, "silent_connections"), 2, "{r}");
    // Each timed-out connection is closed and a new one opened for the next request.
    assert_eq!(server.stop(), 4);
}

#[test]
fn stalled_greeting_server_gives_timeouts() {
    let server = Server::tcp(drain);
    let r = bench_json(&[server.addr(), "-n", "2", "--reconnect", "--timeout", "0.5"]);
    assert_eq!(errors(&r, "timeout"), 2, "{r}");
    assert_eq!(int(&r, "requests"), 0, "{r}");
}

#[test]
fn duration_run_ends_on_time_even_when_stalled() {
    // With a long --timeout, only the end of the run can stop the stalled requests.
    let server = Server::tcp(drain);
    let run = bench(&[
        server.addr(),
        "-d",
        "1",
        "-c",
        "3",
        "--timeout",
        "120",
        "--request",
        r"ping\n",
        "--until",
        r"\n",
        "--json",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.elapsed < Duration::from_secs(40), "took {:?}", run.elapsed);
    let r: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(int(&r, "requests"), 0, "{r}");
    assert_eq!(int(&r, "errors_total"), 0, "{r}");
    assert_eq!(int(&r, "unfinished"), 3, "{r}");
    assert_eq!(int(&r, "silent_connections"), 3, "{r}");
}

#[test]
fn duration_run() {
    let (server, lines) = echo_server(true);
    let r = bench_json(&[
        server.addr(),
        "-d",
        "1",
        "-c",
        "2",
        "--request",
        r"ping\n",
        "--until",
        r"\n",
    ]);
    let requests = int(&r, "requests");
    assert!(requests > 0, "{r}");
    assert_eq!(int(&r, "errors_total"), 0, "{r}");
    assert_eq!(int(&r, "bytes_read"), 5 * requests, "{r}");
    let duration = r["duration_s"].as_f64().expect("duration_s");
    assert!(duration > 0.5 && duration <= 1.0 + 1e-9, "{r}");
    drop(server);
    assert!(lines.load(Ordering::SeqCst) as u64 >= requests);
}

#[test]
fn warmup_requests_are_not_counted() {
    let (server, lines) = echo_server(true);
    let r = bench_json(&[
        server.addr(),
        "--warmup",
        "0.3",
        "-n",
        "20",
        "--request",
        r"ping\n",
        "--until",
        r"\n",
    ]);
    assert_eq!(int(&r, "requests"), 20, "{r}");
    assert_no_errors(&r);
    assert_eq!(int(&r, "bytes_read"), 100, "{r}");
    let warmup = int(&r, "warmup_requests");
    drop(server);
    assert_eq!(lines.load(Ordering::SeqCst) as u64, 20 + warmup);
}

#[test]
fn rate_spreads_requests_over_time() {
    let (server, _) = echo_server(true);
    // 30 requests at 100/s over 2 connections: the last is due 0.29 s after the start.
    let r = bench_json(&[
        server.addr(),
        "--rate",
        "100",
        "-n",
        "30",
        "-c",
        "2",
        "--request",
        r"x\n",
        "--until",
        r"\n",
    ]);
    assert_eq!(int(&r, "requests"), 30, "{r}");
    assert_no_errors(&r);
    assert!(r["duration_s"].as_f64().expect("duration_s") >= 0.28, "{r}");
    assert_eq!(r["rate"].as_f64(), Some(100.0));
}

#[test]
fn unix_socket_address() {
    let (server, lines) = echo_server(false);
    assert!(server.addr().starts_with("unix:"));
    let r = bench_json(&[
        server.addr(),
        "-n",
        "30",
        "-c",
        "2",
        "--request",
        r"ping\n",
        "--until",
        r"\n",
    ]);
    assert_eq!(int(&r, "requests"), 30, "{r}");
    assert_no_errors(&r);
    assert_eq!(int(&r, "bytes_read"), 150, "{r}");
    assert_eq!(server.stop(), 2);
    assert_eq!(lines.load(Ordering::SeqCst), 30);
}

#[test]
fn unix_socket_http_uses_localhost_as_host() {
    let server = Server::unix(|conn| {
        for_each_message(conn, b"\r\n\r\n", |head, conn| {
            if head == b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n" {
                conn.write_all(CL_RESPONSE)
            } else {
                conn.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            }
        })
    });
    let r = bench_json(&[server.addr(), "-n", "5", "--http", "/"]);
    assert_eq!(int(&r, "requests"), 5, "{r}");
    assert_eq!(int(&r, "non_2xx_3xx"), 0, "{r}");
}

#[test]
fn connect_errors_are_counted() {
    let path = support::unique_path("sock"); // nothing listens there
    let addr = format!("unix:{}", path.display());
    let r = bench_json(&[&addr, "-n", "5", "-c", "2", "--request", r"x\n", "--until", r"\n"]);
    assert_eq!(errors(&r, "connect"), 5, "{r}");
    assert_eq!(int(&r, "errors_total"), 5, "{r}");
    assert_eq!(int(&r, "requests"), 0, "{r}");
}

#[test]
fn request_file_is_sent_as_is() {
    let path = support::unique_path("req");
    std::fs::write(&path, b"line one\\n\n").expect("write request file");
    let (server, lines) = echo_server(true);
    let r = bench_json(&[
        server.addr(),
        "-n",
        "4",
        "--request-file",
        path.to_str().unwrap(),
        "--until",
        r"\n",
    ]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(int(&r, "requests"), 4, "{r}");
    assert_eq!(int(&r, "bytes_read"), 4 * 11, "{r}");
    drop(server);
    assert_eq!(lines.load(Ordering::SeqCst), 4);
}

#[test]
fn text_report() {
    let (server, _) = echo_server(true);
    let run = bench(&[
        server.addr(),
        "-n",
        "10",
        "--request",
        r"ping\n",
        "--until",
        r"\n",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    for label in [
        "Target:",
        "Requests:",
        "Duration:",
        "Requests/s:",
        "Transfer:",
        "Errors:",
        "Latency:",
        "p99.9",
    ] {
        assert!(run.stdout.contains(label), "{label} missing in:\n{}", run.stdout);
    }
    assert!(run.stdout.contains("10 completed"), "{}", run.stdout);
    assert!(run.stdout.contains("50 bytes read"), "{}", run.stdout);
    // stderr is not a terminal here, and --progress was not given: no progress lines.
    assert_eq!(run.stderr, "");
}

#[test]
fn progress_lines_with_progress() {
    let (server, _) = echo_server(true);
    let run = bench(&[
        server.addr(),
        "-d",
        "2.5",
        "--progress",
        "--request",
        r"ping\n",
        "--until",
        r"\n",
        "--json",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert!(!lines.is_empty(), "no progress line");
    for line in lines {
        assert!(
            line.starts_with("appsrv-bench: ") && line.contains("req/s"),
            "{line:?}"
        );
    }
    serde_json::from_str::<serde_json::Value>(&run.stdout).expect("json on stdout");
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["127.0.0.1:1"][..],                                    // no framing
        &["127.0.0.1:1", "--until", r"\q"],                      // bad escape
        &["127.0.0.1:1", "--until", "x", "-n", "5", "-d", "1"],  // -n and -d
        &["127.0.0.1:1", "--until", "x", "--response-len", "5"], // two framings
        &["127.0.0.1:1", "--http", "/", "--request", "x"],       // two requests
        &["127.0.0.1:1", "--reconnect", "--pipeline", "2"],      // pipeline needs keep-alive
        &["no-port", "--reconnect"],                             // not HOST:PORT
        &["127.0.0.1:1", "--reconnect", "--timeout", "soon"],    // not seconds
        &["127.0.0.1:1", "--reconnect", "--no-such-option"],
        &[],
    ] {
        let run = bench(args);
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
        assert!(!run.stderr.is_empty(), "{args:?}");
        assert_eq!(run.stdout, "", "{args:?}");
    }
}

#[test]
fn fatal_errors_exit_1() {
    let missing = support::unique_path("missing");
    let run = bench(&[
        "127.0.0.1:1",
        "--reconnect",
        "--request-file",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("cannot read the request file"),
        "{}",
        run.stderr
    );
    // .invalid never resolves (RFC 2606).
    let run = bench(&["no-such-host.invalid:80", "--reconnect", "-n", "1"]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("cannot resolve"), "{}", run.stderr);
}

#[test]
fn help_states_the_defaults() {
    let run = bench(&["--help"]);
    assert_eq!(run.code, Some(0));
    for text in [
        "[default: 1]",
        "[default: 1000",
        "[default: 0]",
        "[default: 10]",
        "[default: keep-alive",
        "latency_us",
        "bad_response",
    ] {
        assert!(run.stdout.contains(text), "{text:?} missing in --help");
    }
}
