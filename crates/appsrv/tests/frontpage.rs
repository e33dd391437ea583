//! The `frontpage` example (issue 20) on SQLite, driven as a real server: every page equals
//! its golden file (tests/data/frontpage/) on both workers, the 400/401/404/405/415 answers,
//! refused `POST /item`s write nothing and an accepted one shows on the pages, a rotated
//! API token takes effect on reload, a database locked by another process gets 503 while
//! pages are still served, the master's preparation of the database file (created for the
//! workers' user, refused when they could not write it, not touched by `stop` and
//! `status`), the start-up errors, and `--sandbox`.
//!
//! Each test has a database of its own, in a scratch directory. The tests about the
//! workers' user need root (the machine's and CI's tests run as root: the workers are
//! `nobody`); as another user they are reported ignored, with the reason (they run from
//! tests/conditional.rs, issue 41).

mod frontpage_common;
mod util;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};

use frontpage_common::*;
use util::*;

/// The example with a token file (TOKEN) and a control socket in `dir`.
fn with_token(dir: &TempDir, extra: &[&str]) -> Server {
    let token = dir.write("token", &format!("{TOKEN}\n"), 0o600);
    let ctl = dir.str("ctl.sock");
    let db = dir.sqlite("db/frontpage.db");
    let mut args = vec!["--api-token-file", &token, "--control", &ctl];
    args.extend_from_slice(extra);
    frontpage(&db, &args)
}

/// `status --json` of the server with `dir`'s control socket.
fn status_json(dir: &TempDir) -> serde_json::Value {
    let out = frontpage_cmd(&["status", "--json", "--control", &dir.str("ctl.sock")]);
    assert!(out.status.success(), "status: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

/// The uid of the workers' user when the tests run as root.
fn nobody_uid() -> u32 {
    nix::unistd::User::from_name("nobody")
        .unwrap()
        .expect("a user nobody")
        .uid
        .as_raw()
}

#[test]
fn golden_files_have_the_expected_shape() {
    frontpage_common::golden_files_have_the_expected_shape();
}

#[test]
fn every_page_equals_its_golden_file_and_head_sends_no_body() {
    let dir = TempDir::new("pages");
    let server = frontpage(&dir.sqlite("db/frontpage.db"), &[]);
    check_pages(server.tcp_addr());
}

#[test]
fn pages_are_the_same_on_repeated_requests_and_on_both_workers() {
    let dir = TempDir::new("workers");
    let ctl = dir.str("ctl.sock");
    let server = frontpage(&dir.sqlite("db/frontpage.db"), &["--control", &ctl]);
    let addr = server.tcp_addr();
    // In blocking mode a worker serves one connection at a time: two connections open
    // together are served by two workers, each for all of its requests.
    let mut conns = [Conn::open(addr), Conn::open(addr)];
    for round in 0..3 {
        for (target, file) in PAGES {
            for (i, c) in conns.iter_mut().enumerate() {
                let r = c.get(target);
                assert!(
                    r.status == 200 && r.text() == golden(file),
                    "round {round}, connection {i}, GET {target}: {} {:?}",
                    r.status,
                    r.text()
                );
            }
        }
    }
    // The status shows which worker holds which connection.
    let status = status_json(&dir);
    let clients: HashSet<(i64, String)> = status["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| Some((w["pid"].as_i64()?, w["client"].as_str()?.to_owned())))
        .collect();
    let ours: HashSet<String> = conns.iter().map(|c| c.local_addr().to_string()).collect();
    let serving: HashSet<i64> = clients
        .iter()
        .filter(|(_, client)| ours.contains(client))
        .map(|(pid, _)| *pid)
        .collect();
    assert_eq!(serving.len(), 2, "both workers served the pages: {status:#}");
}

#[test]
fn bad_reads_get_400_404_and_405() {
    let dir = TempDir::new("errors");
    let server = frontpage(&dir.sqlite("db/frontpage.db"), &[]);
    check_read_errors(server.tcp_addr());
    // The workers survive every one of them.
    let before = server.worker_pids();
    check_pages(server.tcp_addr());
    assert_eq!(server.worker_pids(), before);
}

#[test]
fn refused_posts_write_nothing_and_an_accepted_one_shows_on_the_pages() {
    let dir = TempDir::new("post");
    let server = with_token(&dir, &[]);
    let addr = server.tcp_addr();
    check_post_refusals(addr, TOKEN);
    check_post(addr, TOKEN);
}

both_io!(not_async("frontpage serves async only on PostgreSQL (tests/frontpage_postgres.rs)"): issue_31_a_wrong_token_refuses_the_address_for_a_while);
/// Issue 31: a wrong token is a failed authentication. Its 401 ends the connection and says
/// for how long the address is refused (`Retry-After`: 1 s, then 2 s for the next failure
/// in a row, on a connection admitted before); until then the address's new connections are
/// closed without a reply, while another address is served; then it is served again. In
/// each I/O model: the charge is the worker's, the refusal the admission of whichever
/// process accepts (a worker, an event loop, a hybrid front).
fn issue_31_a_wrong_token_refuses_the_address_for_a_while(io: Io) {
    let dir = TempDir::new(&format!("penalty-{}", io.name()));
    let server = with_token(&dir, &io.args(&[]));
    let addr = server.tcp_addr();
    let json = item_json("After the penalty");
    // Two connections, each admitted (one per worker, a page served on each) before the
    // first failure: a parallel brute force.
    let mut conns: Vec<Conn> = (0..2).map(|_| Conn::open(addr)).collect();
    for c in &mut conns {
        assert_eq!(c.get("/").status, 200);
    }
    let wrong = [
        ("Authorization", "Bearer not-the-token-at-all-0123"),
        ("Content-Type", "application/json"),
    ];
    let mut waits = Vec::new();
    for c in &mut conns {
        let r = c.request("POST", "/item", &wrong, &json);
        r.expect(
            401,
            "wrong token; new connections from your address are refused for",
        );
        assert_eq!(r.header("connection"), Some("close"), "{r:?}");
        waits.push(r.header("retry-after").unwrap_or_default().to_owned());
    }
    assert_eq!(waits, ["1", "2"], "each failure in a row doubles the refusal");
    // Refused now (for 2 s from the second failure): closed at once, without a reply.
    let mut s = connect_from("127.0.0.1", addr);
    let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n");
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(
        got.is_empty(),
        "a penalized address was answered: {:?}",
        text(&got)
    );
    let line = server.wait_for_log("refusing connections from 127.0.0.1 for ");
    assert!(line.contains("2 failed authentication(s) in a row"), "{line}");
    // Another client, from another address, with the token: served meanwhile.
    let r = post_item_from("127.0.0.2", addr, Some(TOKEN), Some("application/json"), &json);
    assert_eq!(r.status, 201, "{r:?} {:?}", r.text());
    // Once the refusal ends, the address is served again.
    let served = wait_until(|| {
        let mut s = connect_from("127.0.0.1", addr);
        let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        text(&got).starts_with("HTTP/1.1 200 ").then_some(())
    });
    assert!(
        served.is_some(),
        "127.0.0.1 still refused; log:\n{}",
        server.log_text()
    );
}

/// A new item's time is the time of its POST, in UTC, as the seed's are written.
#[test]
fn a_posted_item_shows_the_time_it_was_written() {
    let dir = TempDir::new("posted-time");
    let token = dir.write("token", TOKEN, 0o600);
    let server = frontpage(&dir.sqlite("db/frontpage.db"), &["--api-token-file", &token]);
    let addr = server.tcp_addr();
    let utc_now = || {
        let out = std::process::Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M"])
            .output()
            .unwrap();
        text(&out.stdout).trim().to_owned()
    };
    let before = utc_now();
    post_ok(addr, TOKEN, &item_json("What time is it"), SEED_ITEMS + 1);
    let after = utc_now();
    let page = get(addr, &format!("/item/{}", SEED_ITEMS + 1)).text();
    assert!(
        page.contains(&format!(", {before} (0 points)")) || page.contains(&format!(", {after} (0 points)")),
        "not written at {before} or {after}: {page}"
    );
}

/// A password in the database's URL (in the user part or as a parameter) is never written
/// to the log, not even in the error of a connection that fails.
#[test]
fn database_passwords_stay_out_of_the_log() {
    // Port 1 refuses at once: the worker starts without a connection and says why.
    let url = "postgres://frontpage:s3cret@127.0.0.1:1/db?password=hunter2&connect_timeout=2";
    let server = Server::start("frontpage", &["-l", "127.0.0.1:0", "-w", "1", "--database", url]);
    let r = get(server.tcp_addr(), "/");
    assert_eq!(r.status, 503, "{:?}", r.text());
    let log = server.log_text();
    assert!(
        log.contains("postgres://frontpage:***@127.0.0.1:1/db?password=***&connect_timeout=2"),
        "{log}"
    );
    assert!(!log.contains("s3cret") && !log.contains("hunter2"), "{log}");
    // A bad URL's error does not quote it either.
    let out = frontpage_cmd(&["check", "--database", "postgres://u:s3cret@host:notaport/db"]);
    assert!(!out.status.success());
    assert!(!text(&out.stderr).contains("s3cret"), "{}", text(&out.stderr));
}

#[test]
fn without_a_token_file_every_post_gets_401() {
    let dir = TempDir::new("no-token");
    let server = frontpage(&dir.sqlite("db/frontpage.db"), &[]);
    let addr = server.tcp_addr();
    for token in [None, Some(TOKEN), Some("")] {
        let r = post_item(addr, token, Some("application/json"), &item_json("A title"));
        r.expect(401, "no API token is configured (--api-token-file)");
        assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"frontpage\""));
    }
    assert_nothing_written(addr, "POSTs without a configured token");
}

#[test]
fn a_rotated_token_takes_effect_on_reload_and_on_hup() {
    let dir = TempDir::new("rotate");
    let server = with_token(&dir, &[]);
    let addr = server.tcp_addr();
    let ctl = dir.str("ctl.sock");
    let replaced = |before: &HashSet<i32>| {
        let done = wait_until(|| {
            let now = server.worker_pids();
            (now.len() == 2 && now.is_disjoint(before)).then_some(())
        });
        assert!(
            done.is_some(),
            "the workers were not replaced; log:\n{}",
            server.log_text()
        );
    };
    let json = item_json("Rotated");
    post_ok(addr, TOKEN, &json, SEED_ITEMS + 1);

    // `frontpage reload`: the new workers know the new token only.
    let second = "second-token-abcdefghijklmnop";
    dir.write("token", &format!("{second}\n"), 0o600);
    let before = server.worker_pids();
    let out = frontpage_cmd(&["reload", "--control", &ctl]);
    assert!(out.status.success(), "reload: {}", text(&out.stderr));
    replaced(&before);
    // The old token from another address: its failure refuses that address (issue 31).
    post_item_from("127.0.0.2", addr, Some(TOKEN), Some("application/json"), &json)
        .expect(401, "wrong token");
    post_ok(addr, second, &json, SEED_ITEMS + 2);

    // SIGHUP does the same.
    let third = "third-token-0123456789abcdef";
    dir.write("token", &format!("{third}\n"), 0o600);
    let before = server.worker_pids();
    server.signal(libc::SIGHUP);
    server.wait_for_log("reload asked by SIGHUP: starting generation 2");
    replaced(&before);
    post_item_from("127.0.0.3", addr, Some(second), Some("application/json"), &json)
        .expect(401, "wrong token");
    post_ok(addr, third, &json, SEED_ITEMS + 3);

    // A token file that became unusable fails the reload, and the current token stays.
    dir.write("token", "short\n", 0o600);
    let before = server.worker_pids();
    let out = frontpage_cmd(&["reload", "--control", &ctl]);
    assert!(!out.status.success(), "a reload with a short token succeeded");
    assert!(
        text(&out.stderr).contains("must be at least 16 visible ASCII characters"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(server.worker_pids(), before, "the same workers");
    post_ok(addr, third, &json, SEED_ITEMS + 4);
}

#[test]
fn a_locked_database_gets_503_for_writes_while_pages_are_served() {
    let dir = TempDir::new("locked");
    let server = with_token(&dir, &["--db-busy-timeout", "100"]);
    let addr = server.tcp_addr();
    let before = server.worker_pids();
    let status_pids = |s: &serde_json::Value| -> HashSet<i32> {
        s["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["pid"].as_i64().unwrap() as i32)
            .collect()
    };
    assert_eq!(status_pids(&status_json(&dir)), before);

    // Another process holds the write lock.
    let other = rusqlite::Connection::open(dir.path("db/frontpage.db")).unwrap();
    other.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let json = item_json("While locked");
    for _ in 0..4 {
        let started = Instant::now();
        let r = post_item(addr, Some(TOKEN), Some("application/json"), &json);
        r.expect(503, "the database is unavailable; try again");
        assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
        // It waited for the lock (--db-busy-timeout) before it gave up.
        assert!(
            started.elapsed() >= Duration::from_millis(100),
            "503 after {:?}",
            started.elapsed()
        );
    }
    // WAL: readers do not wait for the writer.
    check_pages(addr);
    assert_eq!(server.worker_pids(), before, "no worker was replaced");
    assert_eq!(status_pids(&status_json(&dir)), before);

    other.execute_batch("ROLLBACK").unwrap();
    post_ok(addr, TOKEN, &json, SEED_ITEMS + 1);
    assert_eq!(server.worker_pids(), before);
    assert!(
        !server.log_text().contains("database error"),
        "{}",
        server.log_text()
    );
}

fn the_master_creates_the_database_for_the_workers_user_and_closes_it() {
    let dir = TempDir::new("owner");
    let token = dir.write("token", TOKEN, 0o600);
    let server = frontpage(&dir.sqlite("new/db/frontpage.db"), &["--api-token-file", &token]);
    let nobody = nobody_uid();
    for name in ["new/db", "new/db/frontpage.db"] {
        assert_eq!(
            std::fs::metadata(dir.path(name)).unwrap().uid(),
            nobody,
            "{name} belongs to the workers' user"
        );
    }
    // The master closed the database before it forked; the workers opened it as nobody.
    for pid in server.worker_pids() {
        assert_eq!(proc_ids(pid, "Uid:"), vec![nobody; 4], "worker {pid}");
    }
    let database_fds = |pid: i32| -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .map(|p| p.to_string_lossy().into_owned())
            .filter(|p| p.contains("frontpage.db"))
            .collect()
    };
    assert_eq!(
        database_fds(server.pid()),
        Vec::<String>::new(),
        "the master's descriptors"
    );
    for pid in server.worker_pids() {
        assert!(
            !database_fds(pid).is_empty(),
            "worker {pid} has the database open"
        );
    }
    let addr = server.tcp_addr();
    post_ok(addr, TOKEN, &item_json("Written by nobody"), SEED_ITEMS + 1);
    for name in [
        "new/db/frontpage.db",
        "new/db/frontpage.db-wal",
        "new/db/frontpage.db-shm",
    ] {
        assert_eq!(
            std::fs::metadata(dir.path(name)).unwrap().uid(),
            nobody,
            "{name} belongs to the workers' user"
        );
    }
    assert!(get(addr, "/").text().contains("501 items"));
}

/// Runs `frontpage ARGS` until it exits by itself, and returns its status and log.
fn run_to_exit(args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut server = Server::spawn("frontpage", args, &[]);
    let status = server.wait_exit();
    server.wait_for_log_end();
    (status, server.log_text())
}

fn a_database_the_workers_could_not_write_stops_the_start() {
    let dir = TempDir::new("unwritable");
    // A directory of root's, 0755: nobody cannot make the -wal and -shm files there.
    std::fs::create_dir(dir.path("root-dir")).unwrap();
    std::fs::set_permissions(dir.path("root-dir"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let db = dir.sqlite("root-dir/frontpage.db");
    let (status, log) = run_to_exit(&["-l", "127.0.0.1:0", "--database", &db]);
    assert!(!status.success(), "{status:?}; log:\n{log}");
    assert!(
        log.contains(&format!("{}: ", dir.str("root-dir/frontpage.db")))
            && log.contains("not writable by the workers' user nobody"),
        "log:\n{log}"
    );
    // `check` finds it too, without creating anything.
    let out = frontpage_cmd(&["check", "-l", "127.0.0.1:0", "--database", &db]);
    assert!(!out.status.success(), "check passed");
    assert!(
        text(&out.stderr).contains("not writable by the workers' user nobody"),
        "check: {}",
        text(&out.stderr)
    );
    assert!(!dir.path("root-dir/frontpage.db").exists());
    assert!(
        !log.contains("listening on"),
        "it bound its listener first; log:\n{log}"
    );

    // A database file of root's, 0644, in a directory nobody may write.
    std::fs::create_dir(dir.path("their-dir")).unwrap();
    std::os::unix::fs::chown(dir.path("their-dir"), Some(nobody_uid()), None).unwrap();
    dir.write("their-dir/frontpage.db", "", 0o644);
    let db = dir.sqlite("their-dir/frontpage.db");
    let (status, log) = run_to_exit(&["run", "-l", "127.0.0.1:0", "--database", &db]);
    assert!(!status.success(), "{status:?}; log:\n{log}");
    assert!(
        log.contains(&format!("{}: ", dir.str("their-dir/frontpage.db")))
            && log.contains("not writable by the workers' user nobody"),
        "log:\n{log}"
    );
    assert!(!log.contains("listening on"), "log:\n{log}");
}

/// The workers' directory is theirs: a link planted there must not make the root master
/// create (and hand over) a file elsewhere (issue 20's review: it made
/// `/tmp/h700/owned-by-nobody`, in a directory of root's, for nobody).
fn issue_20_a_link_planted_in_the_workers_directory_is_not_followed() {
    let dir = TempDir::new("planted");
    std::fs::create_dir(dir.path("roots")).unwrap();
    std::fs::set_permissions(dir.path("roots"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::create_dir(dir.path("theirs")).unwrap();
    std::os::unix::fs::chown(dir.path("theirs"), Some(nobody_uid()), None).unwrap();
    let target = dir.path("roots/made-by-root");
    std::os::unix::fs::symlink(&target, dir.path("theirs/frontpage.db")).unwrap();
    let db = dir.sqlite("theirs/frontpage.db");
    let (status, log) = run_to_exit(&["-l", "127.0.0.1:0", "--database", &db]);
    assert!(!status.success(), "{status:?}; log:\n{log}");
    assert!(log.contains("a symbolic link: refused"), "log:\n{log}");
    assert!(
        std::fs::symlink_metadata(&target).is_err(),
        "root created the link's target; log:\n{log}"
    );
    // A link higher up, to a directory of root's: the path below it is made by the
    // workers (who cannot write there), never by root (the second review of issue 20:
    // root made `target/data` there, for nobody).
    std::fs::create_dir(dir.path("roots/target")).unwrap();
    std::os::unix::fs::symlink(dir.path("roots/target"), dir.path("theirs/a")).unwrap();
    let deep = dir.sqlite("theirs/a/data/frontpage.db");
    let (status, log) = run_to_exit(&["-l", "127.0.0.1:0", "--database", &deep]);
    assert!(!status.success(), "{status:?}; log:\n{log}");
    assert!(
        log.contains("not writable by the workers' user nobody"),
        "log:\n{log}"
    );
    assert!(
        std::fs::symlink_metadata(dir.path("roots/target/data")).is_err(),
        "root made a directory through the workers' link; log:\n{log}"
    );
    // The file the master makes is the workers' own (made by them, mode 0640).
    std::fs::remove_file(dir.path("theirs/frontpage.db")).unwrap();
    let server = frontpage(&db, &[]);
    let meta = std::fs::metadata(dir.path("theirs/frontpage.db")).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (nobody_uid(), 0o640));
    drop(server);
}

#[test]
fn subcommands_that_serve_nothing_do_not_create_the_database() {
    let dir = TempDir::new("no-create");
    let db = dir.sqlite("never/frontpage.db");
    let pid_file = dir.str("pid");
    let ctl = dir.str("ctl.sock");
    let short_token = dir.write("short-token", "short\n", 0o600);
    // The command line refuses --database with these subcommands; the environment (a
    // service's unit file, say) gives it to every one of them.
    for args in [
        vec!["stop", "--pid-file", &pid_file],
        vec!["status", "--control", &ctl],
        vec!["reload", "--control", &ctl],
    ] {
        let out = std::process::Command::new(example("frontpage"))
            .args(&args)
            .env("FRONTPAGE_DATABASE", &db)
            // A token file that would stop `run` does not stop these: they never read it.
            .env("FRONTPAGE_API_TOKEN_FILE", &short_token)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        // (`stop` of a stopped server succeeds and says so on stdout; the others fail.)
        let said = text(&out.stdout) + &text(&out.stderr);
        assert!(said.contains("not running"), "{args:?}: {said}");
        assert!(
            !dir.path("never").exists(),
            "{args:?} created the database directory"
        );
    }
    let out = frontpage_cmd(&["check", "-l", "127.0.0.1:0", "--database", &db]);
    assert!(out.status.success(), "check: {}", text(&out.stderr));
    assert!(
        !dir.path("never").exists(),
        "check created the database directory"
    );
    // The control experiment: `run` does create it, and says so in the master's log.
    let server = frontpage(&db, &[]);
    assert!(dir.path("never/frontpage.db").exists());
    let log = server.log_text();
    assert!(
        log.contains("master: ") && log.contains("frontpage.db: created, with 500 items of seed data"),
        "log:\n{log}"
    );
    assert!(
        log.contains("no --api-token-file: POST /item answers 401"),
        "log:\n{log}"
    );
    drop(server);
}

#[test]
fn a_bad_database_url_stops_the_start_with_the_reason() {
    for (url, reason) in [
        ("foo", "foo: expected sqlite:PATH, postgres://… or postgresql://…"),
        ("sqlite:", "sqlite: needs a file name (sqlite:PATH)"),
        (
            "postgres://host:notaport/db",
            "postgres://host:notaport/db: invalid connection string",
        ),
    ] {
        let (status, log) = run_to_exit(&["-l", "127.0.0.1:0", "--database", url]);
        assert!(!status.success(), "--database {url}: {status:?}");
        assert!(log.contains(reason), "--database {url}: {log}");
        assert!(!log.contains("listening on"), "--database {url}: {log}");
    }
}

#[test]
fn a_missing_or_short_token_file_stops_run_and_start() {
    let dir = TempDir::new("bad-token");
    let short = dir.write("short", "too-short\n", 0o600);
    let blank = dir.write("blank", "\n", 0o600);
    let spaced = dir.write("spaced", "a token with spaces in it\n", 0o600);
    let missing = dir.str("missing");
    let db = dir.sqlite("db/frontpage.db");
    let cases = [
        (missing.as_str(), "No such file or directory"),
        (short.as_str(), "must be at least 16 visible ASCII characters"),
        (blank.as_str(), "must be at least 16 visible ASCII characters"),
        (spaced.as_str(), "must be at least 16 visible ASCII characters"),
    ];
    for (file, reason) in cases {
        let (status, log) = run_to_exit(&["-l", "127.0.0.1:0", "--database", &db, "--api-token-file", file]);
        assert!(!status.success(), "run --api-token-file {file}: {status:?}");
        assert!(
            log.contains(&format!("--api-token-file {file}")) && log.contains(reason),
            "run --api-token-file {file}: {log}"
        );
        assert!(!log.contains("listening on"), "{log}");
    }
    // `start` fails before it detaches: it says why, and leaves nothing behind.
    let pid_file = dir.str("pid");
    let ctl = dir.str("ctl.sock");
    let log_file = dir.str("log");
    for (file, reason) in cases {
        let out = frontpage_cmd(&[
            "start",
            "-l",
            "127.0.0.1:0",
            "--database",
            &db,
            "--api-token-file",
            file,
            "--pid-file",
            &pid_file,
            "--control",
            &ctl,
            "--log-file",
            &log_file,
        ]);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "start --api-token-file {file}: {err}");
        assert!(err.contains(reason), "start --api-token-file {file}: {err}");
        assert!(!dir.path("pid").exists(), "start left a pid file");
        assert_eq!(dir.processes(), Vec::<i32>::new(), "start left a process running");
    }
}

#[test]
fn sandboxed_workers_serve_pages_and_write() {
    let dir = TempDir::new("sandbox");
    let server = with_token(&dir, &["--sandbox"]);
    let addr = server.tcp_addr();
    for pid in server.worker_pids() {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(
            status.lines().any(|l| l == "Seccomp:\t2"),
            "worker {pid} runs under a seccomp filter:\n{status}"
        );
    }
    check_pages(addr);
    post_ok(addr, TOKEN, &item_json("Sandboxed"), SEED_ITEMS + 1);
    assert!(get(addr, "/").text().contains("501 items"));
}

/// The tests of this file that run only where their conditions hold, reported ignored
/// with the reason elsewhere: `tests/conditional.rs` runs them (issue 41).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn conditional() -> Vec<libtest_mimic::Trial> {
    use util::needs::{Need, test};
    vec![
        test(
            "the_master_creates_the_database_for_the_workers_user_and_closes_it",
            &[Need::Root],
            the_master_creates_the_database_for_the_workers_user_and_closes_it,
        ),
        test(
            "a_database_the_workers_could_not_write_stops_the_start",
            &[Need::Root],
            a_database_the_workers_could_not_write_stops_the_start,
        ),
        test(
            "issue_20_a_link_planted_in_the_workers_directory_is_not_followed",
            &[Need::Root],
            issue_20_a_link_planted_in_the_workers_directory_is_not_followed,
        ),
    ]
}
