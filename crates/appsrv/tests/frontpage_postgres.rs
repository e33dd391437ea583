//! The `frontpage` example (issue 20) on PostgreSQL, driven as a real server against a real
//! cluster: the pages equal the same golden files as on SQLite, the 400/401/404 answers and
//! a POST, the workers' connections belong to the role named after the workers' user (peer
//! authentication: they were made after the privilege drop, since the master is root),
//! `--sandbox`, and a database restart under keep-alive load that clients see as 503s,
//! never as a 500, a dropped connection or a crashed worker.
//!
//! Needs a running cluster with peer authentication on its socket and a role `nobody`, and
//! root (to run `createdb` as `postgres`, and so that the workers are `nobody`):
//!
//! ```text
//! APPSRV_TEST_POSTGRES=/var/run/postgresql APPSRV_TEST_POSTGRES_CLUSTER=15/main \
//!     cargo test -p appsrv --test frontpage_postgres
//! ```
//!
//! `APPSRV_TEST_POSTGRES` is the socket directory, `APPSRV_TEST_POSTGRES_CLUSTER` the
//! cluster as `VERSION/NAME` for `pg_ctlcluster` (`.ci/run` sets both). Without them the
//! tests are reported as ignored, with the reason, never as passed (issue 34: they used to
//! "pass" in no time), and under `CI`, where they must run, the run fails. A harness of its
//! own (libtest-mimic, `harness = false`) decides that at run time, which `#[ignore]`
//! cannot.
//!
//! Each test has a database of its own (`createdb -O nobody`), dropped at the end, also
//! when the test fails. The restart test stops the whole cluster: it holds [`CLUSTER`] for
//! writing, the others for reading, so that none of them runs during the outage.

mod frontpage_common;
mod util;

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use frontpage_common::*;
use util::*;

/// Held for reading by every test, for writing by the one that restarts the cluster.
static CLUSTER: RwLock<()> = RwLock::new(());

/// Where the cluster is, from the environment.
#[derive(Debug, Clone)]
struct Pg {
    socket_dir: String,
    version: String,
    name: String,
}

/// Runs the tests, or reports them ignored (with the reason) when no cluster is set up;
/// under `CI` that is a failure.
fn main() -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    let tests: &[(&str, fn())] = &[
        (
            "pages_equal_the_golden_files_of_sqlite",
            pages_equal_the_golden_files_of_sqlite,
        ),
        (
            "bad_requests_are_refused_and_a_post_is_written",
            bad_requests_are_refused_and_a_post_is_written,
        ),
        (
            "the_workers_connect_as_their_own_user_after_the_privilege_drop",
            the_workers_connect_as_their_own_user_after_the_privilege_drop,
        ),
        (
            "sandboxed_workers_reach_postgres",
            sandboxed_workers_reach_postgres,
        ),
        (
            "a_database_restart_under_load_gets_503_and_no_worker_crashes",
            a_database_restart_under_load_gets_503_and_no_worker_crashes,
        ),
        ("the_test_databases_are_dropped", the_test_databases_are_dropped),
        (
            "issue_20_a_worker_started_during_an_outage_answers_503_then_pages",
            issue_20_a_worker_started_during_an_outage_answers_503_then_pages,
        ),
        (
            "issue_20_a_read_after_the_session_was_ended_gets_its_page",
            issue_20_a_read_after_the_session_was_ended_gets_its_page,
        ),
        (
            "issue_33_the_async_mode_answers_the_blocking_modes_bytes",
            issue_33_the_async_mode_answers_the_blocking_modes_bytes,
        ),
        (
            "issue_33_async_refusals_write_nothing_and_a_post_is_written",
            issue_33_async_refusals_write_nothing_and_a_post_is_written,
        ),
        (
            "issue_33_two_async_workers_serve_200_concurrent_keepalive_clients",
            issue_33_two_async_workers_serve_200_concurrent_keepalive_clients,
        ),
        (
            "issue_33_async_reads_after_the_sessions_were_ended_get_their_pages",
            issue_33_async_reads_after_the_sessions_were_ended_get_their_pages,
        ),
        (
            "issue_33_an_async_database_restart_under_load_gets_503_then_pages",
            issue_33_an_async_database_restart_under_load_gets_503_then_pages,
        ),
        (
            "issue_33_an_async_worker_started_during_an_outage_answers_503_then_pages",
            issue_33_an_async_worker_started_during_an_outage_answers_503_then_pages,
        ),
        (
            "issue_33_sandboxed_async_workers_reach_postgres",
            issue_33_sandboxed_async_workers_reach_postgres,
        ),
    ];
    let skip = skip_reason();
    if let Some(why) = &skip {
        if std::env::var_os("CI").is_some() {
            eprintln!("error: CI is set, and the PostgreSQL tests must run there: {why}");
            return std::process::ExitCode::FAILURE;
        }
        eprintln!("frontpage_postgres: every test ignored: {why}");
    }
    let trials = tests
        .iter()
        .map(|&(name, test)| {
            libtest_mimic::Trial::test(name, move || {
                test();
                Ok(())
            })
            .with_ignored_flag(skip.is_some())
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// Why the tests cannot run here, if they cannot.
fn skip_reason() -> Option<String> {
    let set = |var: &str| std::env::var(var).ok().filter(|v| !v.is_empty()).is_some();
    if !is_root() {
        return Some(
            "the tests run as root (createdb as postgres, workers as nobody with peer authentication)".into(),
        );
    }
    if !set("APPSRV_TEST_POSTGRES") || !set("APPSRV_TEST_POSTGRES_CLUSTER") {
        return Some(
            "set APPSRV_TEST_POSTGRES (the socket directory, e.g. /var/run/postgresql) and \
             APPSRV_TEST_POSTGRES_CLUSTER (VERSION/NAME for pg_ctlcluster, e.g. 15/main)"
                .into(),
        );
    }
    None
}

/// The cluster to test against, or `None` (and the reason printed) when the test is to be
/// skipped (only when run with --include-ignored: [`main`] marks them ignored then).
fn cluster() -> Option<Pg> {
    let socket_dir = std::env::var("APPSRV_TEST_POSTGRES")
        .ok()
        .filter(|v| !v.is_empty());
    let cluster = std::env::var("APPSRV_TEST_POSTGRES_CLUSTER")
        .ok()
        .filter(|v| !v.is_empty());
    let why = match (&socket_dir, &cluster) {
        _ if !is_root() => Some(
            "the tests run as root (createdb as postgres, workers as nobody with peer authentication)"
                .to_owned(),
        ),
        (Some(_), Some(_)) => None,
        _ => Some(
            "set APPSRV_TEST_POSTGRES (the socket directory, e.g. /var/run/postgresql) and \
             APPSRV_TEST_POSTGRES_CLUSTER (VERSION/NAME for pg_ctlcluster, e.g. 15/main)"
                .to_owned(),
        ),
    };
    if let Some(why) = why {
        println!("skipped: {why}");
        return None;
    }
    let cluster = cluster.unwrap();
    let (version, name) = cluster
        .split_once('/')
        .unwrap_or_else(|| panic!("APPSRV_TEST_POSTGRES_CLUSTER={cluster:?}: expected VERSION/NAME"));
    Some(Pg {
        socket_dir: socket_dir.unwrap(),
        version: version.to_owned(),
        name: name.to_owned(),
    })
}

/// The cluster, and the shared hold on it; `None` to skip.
fn shared() -> Option<(Pg, RwLockReadGuard<'static, ()>)> {
    let pg = cluster()?;
    Some((pg, CLUSTER.read().unwrap_or_else(|e| e.into_inner())))
}

/// Runs a PostgreSQL client program as `postgres` and returns its stdout; panics when it
/// fails.
fn as_postgres(program: &str, args: &[&str]) -> String {
    let out = Command::new("runuser")
        .args(["-u", "postgres", "--", program])
        .args(args)
        .current_dir("/")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("runuser {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {:?}\n{}",
        out.status,
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// A database of one test's own, owned by `nobody`, dropped on drop (stop the server
/// first: declare it before the server, which is then dropped before it).
struct Database {
    pg: Pg,
    name: String,
}

impl Database {
    fn create(pg: &Pg, tag: &str) -> Database {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("appsrv_frontpage_{}_{tag}_{n}", std::process::id());
        let db = Database { pg: pg.clone(), name };
        as_postgres("createdb", &["-h", &pg.socket_dir, "-O", "nobody", &db.name]);
        db
    }

    /// `--database` for the example: no user, so that the workers connect as their own.
    fn url(&self) -> String {
        format!("postgres:///{}?host={}", self.name, self.pg.socket_dir)
    }

    /// The rows of `sql` run by `postgres` in this database, `|`-separated.
    fn query(&self, sql: &str) -> Vec<String> {
        as_postgres(
            "psql",
            &[
                "-h",
                &self.pg.socket_dir,
                "-X",
                "-At",
                "-d",
                &self.name,
                "-c",
                sql,
            ],
        )
        .lines()
        .map(str::to_owned)
        .collect()
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        // --force ends the connections of a server a failed test left running.
        let out = Command::new("runuser")
            .args(["-u", "postgres", "--", "dropdb", "--if-exists", "--force"])
            .args(["-h", &self.pg.socket_dir, &self.name])
            .current_dir("/")
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            other => eprintln!("dropdb {}: {other:?}", self.name),
        }
    }
}

/// Runs `pg_ctlcluster VERSION NAME ACTION`.
fn pg_ctlcluster(pg: &Pg, action: &str) {
    let out = Command::new("pg_ctlcluster")
        .args([&pg.version, &pg.name, action])
        .stdin(Stdio::null())
        .output()
        .expect("run pg_ctlcluster");
    assert!(
        out.status.success(),
        "pg_ctlcluster {} {} {action}: {:?}\n{}{}",
        pg.version,
        pg.name,
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// Starts the cluster again on drop, if a test stopped it and did not get to start it.
struct Restarter {
    pg: Pg,
    stopped: std::cell::Cell<bool>,
}

impl Drop for Restarter {
    fn drop(&mut self) {
        if self.stopped.get() {
            let out = Command::new("pg_ctlcluster")
                .args([&self.pg.version, &self.pg.name, "start"])
                .stdin(Stdio::null())
                .output();
            eprintln!("started the cluster again after a failure: {out:?}");
        }
    }
}

fn pages_equal_the_golden_files_of_sqlite() {
    let Some((pg, _shared)) = shared() else { return };
    let db = Database::create(&pg, "pages");
    let server = frontpage(&db.url(), &[]);
    check_pages(server.tcp_addr());
    server.wait_for_log("loaded the schema and 500 items of seed data");
    // One worker loaded the seed; the other found it loaded.
    assert_eq!(
        server.log_text().matches("loaded the schema").count(),
        1,
        "{}",
        server.log_text()
    );
}

fn bad_requests_are_refused_and_a_post_is_written() {
    let Some((pg, _shared)) = shared() else { return };
    let db = Database::create(&pg, "post");
    let dir = TempDir::new("pg-post");
    let token = dir.write("token", TOKEN, 0o600);
    let server = frontpage(&db.url(), &["--api-token-file", &token]);
    let addr = server.tcp_addr();
    check_read_errors(addr);
    check_post_refusals(addr, TOKEN);
    // A refused insert ended its transaction at once: no worker's session is left idle in
    // a transaction holding its locks until that worker's next request (the second review
    // of issue 20: a dropped Transaction only queued its ROLLBACK).
    let states = db.query(&format!(
        "SELECT state FROM pg_stat_activity WHERE datname = '{}' AND usename = 'nobody'",
        db.name
    ));
    assert!(
        !states.is_empty() && states.iter().all(|s| s == "idle"),
        "sessions after the refusals: {states:?}"
    );
    check_post(addr, TOKEN);
    // In the database: the seed and the two items, and the first one's two tags.
    assert_eq!(db.query("SELECT COUNT(*) FROM items"), ["502"]);
    assert_eq!(
        db.query(
            "SELECT t.name FROM item_tags it JOIN tags t ON t.id = it.tag_id \
             WHERE it.item_id = 501 ORDER BY t.name"
        ),
        ["rust", "sqlite"]
    );
}

fn the_workers_connect_as_their_own_user_after_the_privilege_drop() {
    let Some((pg, _shared)) = shared() else { return };
    let db = Database::create(&pg, "roles");
    let server = frontpage(&db.url(), &[]);
    let nobody = nix::unistd::User::from_name("nobody")
        .unwrap()
        .unwrap()
        .uid
        .as_raw();
    for pid in server.worker_pids() {
        assert_eq!(proc_ids(pid, "Uid:"), vec![nobody; 4], "worker {pid}");
    }
    check_pages(server.tcp_addr());
    // Peer authentication names the role after the OS user of the connecting process: a
    // worker that connected as root would have been refused (there is no role root), and
    // one that connected before it dropped its privileges would have been root.
    let roles = db.query(&format!(
        "SELECT usename FROM pg_stat_activity WHERE datname = '{}' \
         AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
        db.name
    ));
    assert_eq!(
        roles,
        ["nobody", "nobody"],
        "one connection per worker, as nobody"
    );
    assert_eq!(
        db.query("SELECT tableowner FROM pg_tables WHERE tablename = 'items'"),
        ["nobody"]
    );
}

fn sandboxed_workers_reach_postgres() {
    let Some((pg, _shared)) = shared() else { return };
    let db = Database::create(&pg, "sandbox");
    let dir = TempDir::new("pg-sandbox");
    let token = dir.write("token", TOKEN, 0o600);
    let server = frontpage(&db.url(), &["--sandbox", "--api-token-file", &token]);
    for pid in server.worker_pids() {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(
            status.lines().any(|l| l == "Seccomp:\t2"),
            "worker {pid} runs under a seccomp filter:\n{status}"
        );
    }
    let addr = server.tcp_addr();
    check_pages(addr);
    post_ok(addr, TOKEN, &item_json("Sandboxed"), SEED_ITEMS + 1);
    assert!(get(addr, "/").text().contains("501 items"));
}

/// Sets its flag when dropped, also by a panic.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What one load client saw.
#[derive(Default)]
struct Seen {
    ok: AtomicU64,
    unavailable: AtomicU64,
    /// 200s in a row among the requests sent after the cluster was started again.
    streak_after_start: AtomicU64,
}

/// `GET /` on a keep-alive connection, never retried: the answer must be a well-formed
/// 200 with the front page, or 503 with `Retry-After`; anything else is an error. The
/// connection is opened again only after a response that announced its close.
fn load_request(
    addr: SocketAddr,
    conn: &mut Option<BufReader<TcpStream>>,
    front: &str,
) -> Result<u16, String> {
    let c = match conn {
        Some(c) => c,
        None => {
            let s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
            s.set_read_timeout(Some(PATIENCE)).unwrap();
            conn.insert(BufReader::new(s))
        }
    };
    let result = c
        .get_mut()
        .write_all(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
        .map_err(|e| format!("sending: {e}"))
        .and_then(|()| read_response(c, false));
    let r = match result {
        Ok(r) => r,
        Err(e) => {
            *conn = None;
            return Err(e);
        }
    };
    if r.closes() {
        *conn = None;
    }
    match r.status {
        200 if r.body == front.as_bytes() => Ok(200),
        503 if r.header("retry-after") == Some("1") => Ok(503),
        _ => Err(format!("{} {:?}: {:?}", r.status, r.headers, r.text())),
    }
}

fn a_database_restart_under_load_gets_503_and_no_worker_crashes() {
    // One worker more than clients: the keep-alive clients need not take turns.
    restart_under_load("restart", &["-w", "4"], 4, 3);
}

/// A database restart under keep-alive load from `clients` clients, against the example
/// with `workers` workers and `extra`: the clients see pages, 503s with `Retry-After` during
/// the outage, then pages again (50 in a row each); no other answer, no worker crashes, and
/// a POST is served after the restart (the statements were prepared again).
fn restart_under_load(tag: &str, extra: &[&str], workers: usize, clients: usize) {
    let Some(pg) = cluster() else { return };
    let _exclusive = CLUSTER.write().unwrap_or_else(|e| e.into_inner());
    let db = Database::create(&pg, tag);
    let restarter = Restarter {
        pg: pg.clone(),
        stopped: std::cell::Cell::new(false),
    };
    let dir = TempDir::new(&format!("pg-{tag}"));
    let token = dir.write("token", TOKEN, 0o600);
    let url = db.url();
    let mut args = vec![
        "-l",
        "127.0.0.1:0",
        "--database",
        &url,
        "--api-token-file",
        &token,
    ];
    args.extend_from_slice(extra);
    let server = Server::start("frontpage", &args);
    let before = server.wait_for_workers(workers);
    let addr = server.tcp_addr();
    let front = golden("front.html");

    let stop = AtomicBool::new(false);
    let started_again = AtomicBool::new(false);
    let seen: Vec<Seen> = (0..clients).map(|_| Seen::default()).collect();
    let errors = Mutex::new(Vec::<String>::new());
    // Fails at the first failed request, or when `f` is not true within `deadline`.
    let wait_for = |what: &str, deadline: Duration, f: &dyn Fn() -> bool| {
        let end = Instant::now() + deadline;
        loop {
            let failed = errors.lock().unwrap().clone();
            assert!(failed.is_empty(), "failed requests: {failed:#?}");
            if f() {
                return;
            }
            assert!(Instant::now() < end, "never {what}; log:\n{}", server.log_text());
            std::thread::sleep(Duration::from_millis(20)); // polling a condition
        }
    };
    std::thread::scope(|s| {
        // The clients stop also when this thread fails (the scope waits for them).
        let _stop = StopOnDrop(&stop);
        for (i, seen) in seen.iter().enumerate() {
            let (stop, started_again, front, errors) = (&stop, &started_again, &front, &errors);
            s.spawn(move || {
                let mut conn = None;
                while !stop.load(Ordering::Relaxed) {
                    let after_start = started_again.load(Ordering::SeqCst);
                    match load_request(addr, &mut conn, front) {
                        Ok(200) => {
                            seen.ok.fetch_add(1, Ordering::Relaxed);
                            if after_start {
                                seen.streak_after_start.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        Ok(_) => {
                            seen.unavailable.fetch_add(1, Ordering::Relaxed);
                            seen.streak_after_start.store(0, Ordering::SeqCst);
                        }
                        Err(e) => {
                            errors.lock().unwrap().push(format!("client {i}: {e}"));
                            return;
                        }
                    }
                }
            });
        }
        let all = |f: &dyn Fn(&Seen) -> bool| seen.iter().all(f);
        wait_for("the clients served", PATIENCE, &|| {
            all(&|c| c.ok.load(Ordering::Relaxed) >= 5)
        });
        // Marked first: a stop that fails half-way is started again too.
        restarter.stopped.set(true);
        pg_ctlcluster(&pg, "stop");
        // The outage lasts until every client has seen it.
        wait_for("a 503 for every client during the outage", PATIENCE, &|| {
            all(&|c| c.unavailable.load(Ordering::Relaxed) >= 1)
        });
        pg_ctlcluster(&pg, "start");
        restarter.stopped.set(false);
        started_again.store(true, Ordering::SeqCst);
        // Every client back to pages, for 50 requests in a row.
        wait_for("the clients back to 200", Duration::from_secs(60), &|| {
            all(&|c| c.streak_after_start.load(Ordering::SeqCst) >= 50)
        });
    });
    let failed = errors.into_inner().unwrap();
    assert!(failed.is_empty(), "failed requests: {failed:#?}");
    assert_eq!(server.worker_pids(), before, "the same workers: none crashed");
    let log = server.log_text();
    assert!(log.contains("connection lost"), "{log}");
    assert!(log.contains("connected again"), "{log}");
    assert!(!log.contains("database error"), "{log}");
    // The statements are prepared again on the new connections: a write works. A worker
    // that no client reached since the restart finds its connection gone at this request
    // and answers 503 (nothing written: the insert never ran), as Retry-After says,
    // the next request is served.
    let json = item_json("After the restart");
    let posted = wait_until(|| {
        let r = post_item(addr, Some(TOKEN), Some("application/json"), &json);
        (r.status != 503).then_some(r)
    })
    .expect("a POST served after the restart");
    assert_eq!(posted.status, 201, "{posted:?} {:?}", posted.text());
    assert_eq!(posted.text(), format!("{{\"id\":{}}}\n", SEED_ITEMS + 1));
    let total: u64 = seen.iter().map(|c| c.ok.load(Ordering::Relaxed)).sum();
    let unavailable: u64 = seen.iter().map(|c| c.unavailable.load(Ordering::Relaxed)).sum();
    println!("{total} pages and {unavailable} 503s, no other answer");
    // Stopped before the database is dropped.
    drop(server);
    drop(restarter);
    drop(db);
}

/// Each test's database is gone at its end (its server stopped first): the tests leave
/// nothing in the cluster.
fn the_test_databases_are_dropped() {
    let Some((pg, _shared)) = shared() else { return };
    let name;
    {
        let db = Database::create(&pg, "dropped");
        name = db.name.clone();
        let _server = frontpage(&db.url(), &[]);
        // The server is dropped first (declared last), then the database.
    }
    let left = as_postgres(
        "psql",
        &[
            "-h",
            &pg.socket_dir,
            "-X",
            "-At",
            "-d",
            "postgres",
            "-c",
            &format!("SELECT COUNT(*) FROM pg_database WHERE datname = '{name}'"),
        ],
    );
    assert_eq!(left.trim(), "0");
}

/// A worker that starts while the database is down (a replacement, a reload) starts
/// without a connection and answers 503, rather than fail its start in a back-off loop
/// until no worker is left to answer (issue 20's review); it connects once the database
/// is back.
fn issue_20_a_worker_started_during_an_outage_answers_503_then_pages() {
    started_during_an_outage("outage-start", &[]);
}

/// A worker of the example with one worker and `extra`, replaced while the database is
/// down, answers 503 with `Retry-After`, then the front page once the database is back.
fn started_during_an_outage(tag: &str, extra: &[&str]) {
    let Some(pg) = cluster() else { return };
    let _exclusive = CLUSTER.write().unwrap_or_else(|e| e.into_inner());
    let db = Database::create(&pg, tag);
    let restarter = Restarter {
        pg: pg.clone(),
        stopped: std::cell::Cell::new(false),
    };
    let url = db.url();
    let mut args = vec!["-l", "127.0.0.1:0", "-w", "1", "--database", &url];
    args.extend_from_slice(extra);
    let server = Server::start("frontpage", &args);
    let before = server.wait_for_workers(1);
    let addr = server.tcp_addr();
    assert_eq!(get(addr, "/").status, 200);
    restarter.stopped.set(true);
    pg_ctlcluster(&pg, "stop");
    let old = *before.iter().next().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(old), nix::sys::signal::Signal::SIGKILL).unwrap();
    let replaced = wait_until(|| {
        let pids = server.worker_pids();
        (pids.len() == 1 && !pids.contains(&old)).then_some(pids)
    })
    .expect("a replacement worker started during the outage");
    let r = get(addr, "/");
    assert_eq!(
        (r.status, r.header("retry-after")),
        (503, Some("1")),
        "{:?}",
        r.text()
    );
    assert!(
        server
            .log_text()
            .contains("this worker starts without a connection")
    );
    pg_ctlcluster(&pg, "start");
    restarter.stopped.set(false);
    let page = wait_until(|| {
        let r = get(addr, "/");
        (r.status == 200).then_some(r)
    })
    .expect("pages again once the database is back");
    assert_eq!(page.text(), golden("front.html"));
    assert_eq!(server.worker_pids(), replaced, "the replacement kept serving");
    drop(server);
    drop(restarter);
    drop(db);
}

/// A session the server ended while the worker was idle (`idle_session_timeout`, an
/// administrator, a restart between requests) costs the next read nothing: the worker
/// finds the connection gone, makes a new one and runs the read again (the first review
/// of issue 20 saw `503 503 200` after `pg_terminate_backend`).
fn issue_20_a_read_after_the_session_was_ended_gets_its_page() {
    let Some((pg, _shared)) = shared() else { return };
    let db = Database::create(&pg, "terminated");
    let server = frontpage(&db.url(), &[]);
    let addr = server.tcp_addr();
    assert_eq!(get(addr, "/").status, 200);
    let ended = db.query(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = '{}' AND usename = 'nobody'",
        db.name
    ));
    assert_eq!(ended, ["t", "t"], "two workers, a session each");
    let r = get(addr, "/");
    assert_eq!(r.status, 200, "{:?}", r.text());
    assert_eq!(r.text(), golden("front.html"));
    let log = server.log_text();
    assert!(
        log.contains("connection lost") && log.contains("connected again"),
        "{log}"
    );
}

// ---------------------------------------------------------------------------------------
// Issue 33: the async mode (PostgreSQL with `--io event`), a few pipelining connections per
// worker on the worker's runtime.

/// The async mode's options: event workers, two connections each.
const ASYNC: [&str; 4] = ["--io", "event", "--db-connections", "2"];

/// A response as a client sees it, but for its `Date`.
fn without_date(r: &frontpage_common::Response) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let headers = r
        .headers
        .iter()
        .filter(|(n, _)| !n.eq_ignore_ascii_case("date"))
        .cloned()
        .collect();
    (r.status, headers, r.body.clone())
}

/// The sessions of the workers' role in `db`.
fn sessions(db: &Database) -> Vec<String> {
    db.query(&format!(
        "SELECT state FROM pg_stat_activity WHERE datname = '{}' AND usename = 'nobody' \
         AND backend_type = 'client backend'",
        db.name
    ))
}

/// Both modes on one database answer the same bytes (status, headers but `Date`, body):
/// the pages, the 400s, 404s and 405s, the refused POSTs (401 without a token, 415, 400 for
/// a bad body and for an unknown author or tag, which the database refuses), and the page
/// of an item posted through the async server.
fn issue_33_the_async_mode_answers_the_blocking_modes_bytes() {
    let Some((pg, _shared)) = shared() else { return };
    let db = Database::create(&pg, "async-bytes");
    let dir = TempDir::new("pg-async-bytes");
    let token = dir.write("token", TOKEN, 0o600);
    let mut async_args = ASYNC.to_vec();
    async_args.extend(["--api-token-file", &token]);
    let asynchronous = frontpage(&db.url(), &async_args);
    let blocking = frontpage(&db.url(), &["--io", "blocking", "--api-token-file", &token]);
    let (a, b) = (asynchronous.tcp_addr(), blocking.tcp_addr());
    // The golden files, HEAD, and the read errors, as every mode must.
    check_pages(a);
    check_read_errors(a);
    let json = Some("application/json");
    let posts: [(&str, Option<&str>, Option<&str>, String); 6] = [
        ("no token", None, json, item_json("t")),
        ("not JSON", Some(TOKEN), Some("text/plain"), item_json("t")),
        ("bad JSON", Some(TOKEN), json, "{\"title\": ".into()),
        (
            "an unknown author",
            Some(TOKEN),
            json,
            r#"{"title":"t","body":"b","author_id":999,"tags":["rust"]}"#.into(),
        ),
        (
            "an unknown tag",
            Some(TOKEN),
            json,
            r#"{"title":"t","body":"b","author_id":1,"tags":["rust","no-such-tag","nor-this"]}"#.into(),
        ),
        (
            "an unknown author and tag",
            Some(TOKEN),
            json,
            r#"{"title":"t","body":"b","author_id":0,"tags":["no-such-tag"]}"#.into(),
        ),
    ];
    for (what, token, content_type, body) in &posts {
        let (ra, rb) = (
            post_item(a, *token, *content_type, body),
            post_item(b, *token, *content_type, body),
        );
        assert!(
            matches!(ra.status, 400 | 401 | 415),
            "{what}: {ra:?} {:?}",
            ra.text()
        );
        assert_eq!(without_date(&ra), without_date(&rb), "POST /item with {what}");
    }
    assert_nothing_written(a, "the refusals");
    // A refusal by the database left no session in a transaction.
    let states = sessions(&db);
    assert!(
        states.iter().all(|s| s == "idle"),
        "sessions after the refusals: {states:?}"
    );
    post_ok(a, TOKEN, &item_json("Posted <async> & 'escaped'"), SEED_ITEMS + 1);
    let targets = [
        "/",
        "/rows?n=1",
        "/rows?n=5",
        "/rows?n=36",
        "/rows?n=134",
        "/rows?n=1000",
        "/rows?n=1001",
        "/rows?n=x",
        "/item/1",
        "/item/7",
        "/item/501",
        "/item/502",
        "/item/abc",
        "/nope",
    ];
    let (mut ca, mut cb) = (Conn::open(a), Conn::open(b));
    for target in targets {
        for method in ["GET", "HEAD", "POST"] {
            let (ra, rb) = (
                ca.request(method, target, &[], ""),
                cb.request(method, target, &[], ""),
            );
            assert_eq!(without_date(&ra), without_date(&rb), "{method} {target}");
        }
    }
    // Item 501, as the blocking mode shows it: the async POST wrote its tags too (the
    // seed has 83 items tagged rust).
    let front = get(b, "/").text();
    assert!(front.contains("rust (84)"), "{front}");
    assert!(
        front.contains("Posted &#60;async&#62; &#38; &#39;escaped&#39;"),
        "{front}"
    );
    drop((asynchronous, blocking));
}

/// `POST /item` in async mode: the refusals of every mode, and accepted items as they show
/// on the pages (the same checks as the blocking mode's), in the database with their tags.
fn issue_33_async_refusals_write_nothing_and_a_post_is_written() {
    let Some((pg, _shared)) = shared() else { return };
    let db = Database::create(&pg, "async-post");
    let dir = TempDir::new("pg-async-post");
    let token = dir.write("token", TOKEN, 0o600);
    let mut args = ASYNC.to_vec();
    args.extend(["--api-token-file", &token]);
    let server = frontpage(&db.url(), &args);
    let addr = server.tcp_addr();
    check_post_refusals(addr, TOKEN);
    check_post(addr, TOKEN);
    assert_eq!(db.query("SELECT COUNT(*) FROM items"), ["502"]);
    assert_eq!(
        db.query(
            "SELECT t.name FROM item_tags it JOIN tags t ON t.id = it.tag_id \
             WHERE it.item_id = 501 ORDER BY t.name"
        ),
        ["rust", "sqlite"]
    );
    drop(server);
}

/// 200 keep-alive clients at once against two async workers with two connections each:
/// every request is answered 200 with its page, by the same two workers, which hold four
/// PostgreSQL sessions between them (the requests in flight share them, pipelined).
fn issue_33_two_async_workers_serve_200_concurrent_keepalive_clients() {
    let Some((pg, _shared)) = shared() else { return };
    let db = Database::create(&pg, "async-load");
    let server = frontpage(&db.url(), &ASYNC);
    let workers = server.worker_pids();
    let addr = server.tcp_addr();
    const CLIENTS: usize = 200;
    const ROUNDS: usize = 5;
    let pages = [
        ("/", golden("front.html")),
        ("/rows?n=36", golden("rows-36.html")),
        ("/rows?n=134", golden("rows-134.html")),
    ];
    // Every client connects, then all send together.
    let start = std::sync::Barrier::new(CLIENTS);
    let failed = Mutex::new(Vec::<String>::new());
    std::thread::scope(|s| {
        for i in 0..CLIENTS {
            let (start, failed, pages) = (&start, &failed, &pages);
            s.spawn(move || {
                let mut c = Conn::open(addr);
                start.wait();
                for round in 0..ROUNDS {
                    let (target, page) = &pages[(i + round) % pages.len()];
                    let r = c.get(target);
                    if r.status != 200 || r.text() != *page {
                        failed.lock().unwrap().push(format!(
                            "client {i}, {target}: {} {:?}",
                            r.status,
                            r.text().lines().next()
                        ));
                        return;
                    }
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap();
    assert!(failed.is_empty(), "{} failed: {failed:#?}", failed.len());
    assert_eq!(server.worker_pids(), workers, "the same two workers");
    let states = sessions(&db);
    assert_eq!(
        states.len(),
        4,
        "two connections per worker: {states:?}; log:\n{}",
        server.log_text()
    );
    drop(server);
}

/// Sessions the server ended (`pg_terminate_backend`) cost the next reads nothing: each
/// worker finds its connections gone, makes them again and runs the reads (as the blocking
/// mode does, issue 20); no worker crashes.
fn issue_33_async_reads_after_the_sessions_were_ended_get_their_pages() {
    let Some((pg, _shared)) = shared() else { return };
    let db = Database::create(&pg, "async-terminated");
    let server = frontpage(&db.url(), &ASYNC);
    let workers = server.worker_pids();
    let addr = server.tcp_addr();
    // Four connections (two per worker), one per request, round-robin, on either worker:
    // two rounds of 8 on a connection each reach them all.
    let mut c = Conn::open(addr);
    let mut d = Conn::open(addr);
    for _ in 0..4 {
        assert_eq!(c.get("/").status, 200);
        assert_eq!(d.get("/").status, 200);
    }
    let before = sessions(&db);
    let ended = db.query(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = '{}' AND usename = 'nobody'",
        db.name
    ));
    assert!(
        ended.len() >= 2 && ended.iter().all(|t| t == "t"),
        "{ended:?} (sessions before: {before:?})"
    );
    let front = golden("front.html");
    for round in 0..4 {
        for conn in [&mut c, &mut d] {
            let r = conn.get("/");
            assert_eq!(r.status, 200, "round {round}: {:?}", r.text());
            assert_eq!(r.text(), front);
        }
    }
    let log = server.log_text();
    assert!(
        log.contains("connection lost") && log.contains("connected again"),
        "{log}"
    );
    assert_eq!(server.worker_pids(), workers, "no worker crashed");
    drop(server);
}

/// A database restart under keep-alive load in async mode: 503 with `Retry-After` during
/// the outage, pages after it, no other answer, no worker crashes, a POST afterwards (the
/// blocking mode's test, with more clients than workers: the async workers hold them all).
fn issue_33_an_async_database_restart_under_load_gets_503_then_pages() {
    let mut extra = vec!["-w", "2"];
    extra.extend(ASYNC);
    restart_under_load("async-restart", &extra, 2, 8);
}

/// An async worker started while the database is down starts without a connection,
/// answers 503, and serves pages once the database is back.
fn issue_33_an_async_worker_started_during_an_outage_answers_503_then_pages() {
    started_during_an_outage("async-outage", &ASYNC);
}

/// `--sandbox` in async mode: the workers run under their seccomp filter and reach
/// PostgreSQL from their runtime (socket, connect), and a POST is written.
fn issue_33_sandboxed_async_workers_reach_postgres() {
    let Some((pg, _shared)) = shared() else { return };
    let db = Database::create(&pg, "async-sandbox");
    let dir = TempDir::new("pg-async-sandbox");
    let token = dir.write("token", TOKEN, 0o600);
    let mut args = ASYNC.to_vec();
    args.extend(["--sandbox", "--api-token-file", &token]);
    let server = frontpage(&db.url(), &args);
    for pid in server.worker_pids() {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(
            status.lines().any(|l| l == "Seccomp:\t2"),
            "worker {pid} runs under a seccomp filter:\n{status}"
        );
    }
    let addr = server.tcp_addr();
    check_pages(addr);
    post_ok(addr, TOKEN, &item_json("Sandboxed"), SEED_ITEMS + 1);
    assert!(get(addr, "/").text().contains("501 items"));
    drop(server);
}
