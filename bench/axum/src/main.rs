//! `axum-peer`: the Rust peer appsrv is benchmarked against. What a Rust user would write
//! instead of appsrv for the same pages: axum 0.8 on Tokio's multi-threaded runtime, with
//! tokio-postgres for the database. It answers the bytes of appsrv's `http_hello` example
//! (`/`, `/sleep`, `/static/NAME`) and, with `--database`, those of its `frontpage`
//! example on PostgreSQL (`/`, `/rows?n=N`), so that a load tool counts the same bodies
//! from both (`check.sh` compares them with `cmp`).
//!
//! ```text
//! cargo build --release --manifest-path bench/axum/Cargo.toml
//! bench/axum/target/release/axum-peer --listen 127.0.0.1:8080 --threads 2
//! bench/axum/target/release/axum-peer --database 'postgres:///frontpage_bench?host=/var/run/postgresql'
//! ```
//!
//! ## Routes
//!
//! - `GET /` (and `HEAD`, as everywhere): without `--database`, `Hello, World!` as
//!   `Content-Type: text/plain` (13 bytes, `http_hello`'s); with it, `frontpage`'s front
//!   page: its three queries (the 20 latest items with their authors, the number of items,
//!   the 20 most used tags) sent together on one connection, so answered in one round
//!   trip, rendered by the same askama templates (frontpage's own files: askama.toml) as
//!   `text/html; charset=utf-8`.
//! - `GET /rows?n=N`, with `--database`, N from 1 to 1000: `frontpage`'s table of the
//!   first N items (1 column up to 5 rows, 6 up to 36, 7 beyond); a bad N is `400` with
//!   `frontpage`'s message.
//! - `GET /sleep?ms=N`, N from 0 to 10000 (else `400`): `tokio::time::sleep`, then
//!   `slept\n` (`text/plain; charset=utf-8`, as `http_hello`). The sleep holds no thread:
//!   where `http_hello` blocks a worker, this task only waits.
//! - `GET /static/NAME` with `--static-dir DIR`: the file NAME of DIR (tower-http's
//!   `ServeDir`: streamed, `Content-Type` from the extension, `404` when missing, no way
//!   out of the directory with `..`).
//! - Other paths: `404` (`not found\n`); other methods than `GET` and `HEAD` on a route:
//!   `405` with `Allow` (axum's).
//!
//! ## Runtime and database
//!
//! One process, `--threads N` Tokio worker threads (default: the number of CPUs), every
//! connection a task: the multi-threaded runtime is built by hand
//! (`Builder::new_multi_thread().worker_threads(N).enable_all()`) rather than by
//! `#[tokio::main]`, only to take N from the command line. Connections get `TCP_NODELAY`,
//! as appsrv's do.
//!
//! `--database URL` takes what tokio-postgres parses: libpq's URL form (`postgres:///DB?
//! host=/var/run/postgresql`, as appsrv's frontpage takes it) or its `key=value` form
//! (`host=/var/run/postgresql dbname=DB`). Without a user in it the connections are made
//! as this process's user name, as `psql` and frontpage do (with peer authentication, run
//! the peer as the role's OS user: `runuser -u nobody -- axum-peer …`). It may also come
//! from `AXUM_PEER_DATABASE`, which other users cannot read in `/proc` as they can a
//! command line. The peer does not create or seed the database: run frontpage on it once
//! (it loads the schema and the seed data into an empty database), then both serve the
//! same rows.
//!
//! The connections are a fixed set of `--db-connections` tokio-postgres clients (default
//! 4), made at start, each with its statements prepared once, and handed to the requests
//! round-robin; no pool crate (deadpool-postgres, bb8). A tokio-postgres client is shared
//! by reference and pipelines the queries of concurrent requests on its one connection, so
//! a request never waits to check a connection out of a pool, and N connections are N
//! PostgreSQL backends, as appsrv's `-w N` workers hold N connections. A pool would lend
//! each connection to one request at a time, capping the queries in flight at N: PHP's
//! model, not the one tokio-postgres is made for. A connection found closed (a server
//! restart) is made again by the next request that picks it, at most once a second while
//! the server is down; a read that finds its connection gone is tried once more on a new
//! one. Requests meanwhile get `503` with `Retry-After: 1`, as from frontpage; any other
//! database error is `500`.
//!
//! SIGINT or SIGTERM stops it gracefully: no new connections, requests in progress end.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use askama::Template;
use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::ListenerExt;
use clap::Parser;
use tokio_postgres::types::Type;

#[derive(Parser, Debug)]
#[command(
    name = "axum-peer",
    about = "axum + Tokio + tokio-postgres: appsrv's http_hello and frontpage pages, for comparison"
)]
struct Args {
    /// The address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: String,

    /// Tokio worker threads (default: the number of CPUs).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    threads: Option<u16>,

    /// Serve the files of DIR under /static/ (without it, /static/ answers 404).
    #[arg(long, value_name = "DIR")]
    static_dir: Option<PathBuf>,

    /// PostgreSQL, as tokio-postgres parses it (postgres:///DB?host=/var/run/postgresql, or
    /// host=… dbname=…): / and /rows?n=N are then frontpage's pages.
    #[arg(long, value_name = "URL", env = "AXUM_PEER_DATABASE", hide_env_values = true)]
    database: Option<String>,

    /// The PostgreSQL connections, used round-robin.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=1000))]
    db_connections: u16,
}

fn main() {
    let args = Args::parse();
    let threads = args.threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        usize::from,
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(format!("the Tokio runtime: {e}")));
    if let Err(e) = runtime.block_on(serve(args, threads)) {
        fail(e);
    }
}

fn fail(why: impl std::fmt::Display) -> ! {
    eprintln!("axum-peer: {why}");
    std::process::exit(1);
}

async fn serve(args: Args, threads: usize) -> Result<(), String> {
    let db = match &args.database {
        Some(url) => Some(Arc::new(Db::open(url, args.db_connections.into()).await?)),
        None => None,
    };
    let mut app = match &db {
        Some(db) => Router::new()
            .route("/", get(front))
            .route("/rows", get(rows))
            .route("/sleep", get(sleep))
            .with_state(Arc::clone(db)),
        None => Router::new().route("/", get(hello)).route("/sleep", get(sleep)),
    };
    if let Some(dir) = &args.static_dir {
        app = app.nest_service("/static", tower_http::services::ServeDir::new(static_root(dir)?));
    }
    let app = app.fallback(|| async { plain(StatusCode::NOT_FOUND, "not found\n") });

    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| format!("--listen {}: {e}", args.listen))?;
    let addr: SocketAddr = listener.local_addr().map_err(|e| e.to_string())?;
    // bench/lib.sh's ready_port reads the port of `--listen 127.0.0.1:0` from this line.
    eprintln!(
        "axum-peer: listening on {addr} with {threads} Tokio worker threads{}: ready",
        match &db {
            Some(db) => format!(", {} PostgreSQL connections", db.slots.len()),
            None => String::new(),
        }
    );
    // TCP_NODELAY on every connection, as appsrv sets it: no delayed-ACK stall at the end of
    // a response.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(stopped())
        .await
        .map_err(|e| e.to_string())
}

/// Resolves when SIGINT or SIGTERM arrives.
async fn stopped() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

/// `--static-dir`, which must be a directory (checked at start, as http_hello does).
fn static_root(dir: &Path) -> Result<PathBuf, String> {
    let root = dir
        .canonicalize()
        .map_err(|e| format!("--static-dir {}: {e}", dir.display()))?;
    if !root.is_dir() {
        return Err(format!("--static-dir {}: not a directory", dir.display()));
    }
    Ok(root)
}

// ---------------------------------------------------------------------------------------
// http_hello's pages.

async fn hello() -> Response {
    ([(CONTENT_TYPE, "text/plain")], "Hello, World!").into_response()
}

async fn sleep(RawQuery(query): RawQuery) -> Response {
    let ms = query
        .as_deref()
        .and_then(|q| q.strip_prefix("ms="))
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|n| *n <= 10_000);
    let Some(ms) = ms else {
        return plain(
            StatusCode::BAD_REQUEST,
            "expected /sleep?ms=N with N from 0 to 10000\n",
        );
    };
    tokio::time::sleep(Duration::from_millis(ms)).await;
    plain(StatusCode::OK, "slept\n")
}

/// A short text/plain response, as appsrv's examples send them.
fn plain(status: StatusCode, text: impl Into<String>) -> Response {
    (status, [(CONTENT_TYPE, "text/plain; charset=utf-8")], text.into()).into_response()
}

// ---------------------------------------------------------------------------------------
// frontpage's pages.

/// The largest `n` of `/rows?n=N`.
const MAX_ROWS: i64 = 1000;

// frontpage's statements (crates/appsrv-frontpage/examples/frontpage/db.rs), word for word.
const SQL_LATEST: &str = "SELECT i.id, i.title, a.name, i.created, i.score FROM items i \
     JOIN authors a ON a.id = i.author_id ORDER BY i.id DESC LIMIT 20";
const SQL_COUNT: &str = "SELECT COUNT(*) FROM items";
const SQL_CLOUD: &str = "SELECT t.name, c.n FROM (SELECT tag_id, COUNT(*) AS n FROM item_tags GROUP BY tag_id) c \
     JOIN tags t ON t.id = c.tag_id ORDER BY c.n DESC, t.id LIMIT 20";
const SQL_ROWS_1: &str = "SELECT title FROM items ORDER BY id LIMIT CAST($1 AS BIGINT)";
const SQL_ROWS_6: &str = "SELECT i.id, i.title, a.name, a.email, i.score, i.created FROM items i \
     JOIN authors a ON a.id = i.author_id ORDER BY i.id LIMIT CAST($1 AS BIGINT)";
const SQL_ROWS_7: &str = "SELECT i.id, i.title, a.name, a.email, i.score, i.created, i.body FROM items i \
     JOIN authors a ON a.id = i.author_id ORDER BY i.id LIMIT CAST($1 AS BIGINT)";

/// An item of the front page's list.
struct Latest {
    id: i64,
    title: String,
    author: String,
    created: String,
    score: i64,
}

/// A tag of the cloud, with its number of items and its weight (1 to 5).
struct Tag {
    name: String,
    count: i64,
    weight: i64,
}

struct Front {
    latest: Vec<Latest>,
    count: i64,
    cloud: Vec<Tag>,
}

struct Table {
    header: &'static [&'static str],
    rows: Vec<Vec<String>>,
}

/// `/`: frontpage's front.html.
#[derive(Template)]
#[template(path = "front.html")]
struct FrontPage<'a> {
    front: &'a Front,
}

/// `/rows?n=N`: frontpage's rows.html.
#[derive(Template)]
#[template(path = "rows.html")]
struct RowsPage<'a> {
    table: &'a Table,
}

/// The column names of `/rows?n=N`: one column up to 5 rows, six up to 36, seven beyond.
fn columns(n: i64) -> &'static [&'static str] {
    match n {
        ..=5 => &["title"],
        6..=36 => &["id", "title", "author", "email", "score", "created"],
        _ => &["id", "title", "author", "email", "score", "created", "body"],
    }
}

/// The cloud's weight of a tag with `count` items when the largest has `max`: 1 to 5.
fn weight(count: i64, max: i64) -> i64 {
    1 + 4 * count / max.max(1)
}

async fn front(State(db): State<Arc<Db>>) -> Response {
    let front = db
        .read(|c: Arc<PgConn>| async move {
            // The three queries go out together, answered in one round trip.
            let (latest, count, tags) = tokio::try_join!(
                c.client.query(&c.latest, &[]),
                c.client.query_one(&c.count, &[]),
                c.client.query(&c.cloud, &[]),
            )?;
            let max = tags.iter().map(|r| r.get::<_, i64>(1)).max().unwrap_or(1);
            Ok(Front {
                latest: latest
                    .iter()
                    .map(|r| Latest {
                        id: r.get(0),
                        title: r.get(1),
                        author: r.get(2),
                        created: r.get(3),
                        score: r.get(4),
                    })
                    .collect(),
                count: count.get(0),
                cloud: tags
                    .iter()
                    .map(|r| Tag {
                        name: r.get(0),
                        count: r.get(1),
                        weight: weight(r.get(1), max),
                    })
                    .collect(),
            })
        })
        .await;
    match front {
        Ok(front) => html(&FrontPage { front: &front }),
        Err(f) => f.into_response(),
    }
}

async fn rows(State(db): State<Arc<Db>>, RawQuery(query): RawQuery) -> Response {
    // frontpage's parse: the first n= of the query, 1 to 4 digits, 1 to MAX_ROWS.
    let n = query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix("n="))
        .filter(|n| !n.is_empty() && n.len() <= 4 && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse::<i64>().ok())
        .filter(|n| (1..=MAX_ROWS).contains(n));
    let Some(n) = n else {
        return plain(
            StatusCode::BAD_REQUEST,
            format!("expected /rows?n=N with N from 1 to {MAX_ROWS}\n"),
        );
    };
    let header = columns(n);
    let width = header.len();
    let rows = db
        .read(|c: Arc<PgConn>| async move {
            let stmt = match width {
                1 => &c.rows_1,
                6 => &c.rows_6,
                _ => &c.rows_7,
            };
            Ok(c.client
                .query(stmt, &[&n])
                .await?
                .iter()
                .map(|r| {
                    (0..width)
                        .map(|i| match *r.columns()[i].type_() {
                            Type::INT8 => r.get::<_, i64>(i).to_string(),
                            _ => r.get::<_, String>(i),
                        })
                        .collect()
                })
                .collect())
        })
        .await;
    match rows {
        Ok(rows) => html(&RowsPage {
            table: &Table { header, rows },
        }),
        Err(f) => f.into_response(),
    }
}

/// A page as `text/html; charset=utf-8`.
fn html(page: &impl Template) -> Response {
    match page.render() {
        Ok(body) => ([(CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response(),
        Err(e) => {
            eprintln!("axum-peer: template: {e}");
            plain(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n")
        }
    }
}

// ---------------------------------------------------------------------------------------
// The connections.

/// Why a page could not be made: frontpage's 503 and 500.
enum Failure {
    /// The server cannot be reached, or the connection is gone: 503, Retry-After: 1.
    Unavailable,
    /// Anything else: 500, logged.
    Internal(String),
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        match self {
            Failure::Unavailable => {
                let mut res = plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the database is unavailable; try again\n",
                );
                res.headers_mut()
                    .insert(RETRY_AFTER, HeaderValue::from_static("1"));
                res
            }
            Failure::Internal(why) => {
                eprintln!("axum-peer: database error: {why}");
                plain(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n")
            }
        }
    }
}

/// A connection and its prepared statements.
struct PgConn {
    client: tokio_postgres::Client,
    latest: tokio_postgres::Statement,
    count: tokio_postgres::Statement,
    cloud: tokio_postgres::Statement,
    rows_1: tokio_postgres::Statement,
    rows_6: tokio_postgres::Statement,
    rows_7: tokio_postgres::Statement,
}

impl PgConn {
    /// Connects, spawns the connection's task, and prepares the statements (pipelined:
    /// one round trip).
    async fn connect(config: &tokio_postgres::Config) -> Result<PgConn, tokio_postgres::Error> {
        let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("axum-peer: a PostgreSQL connection ended: {}", describe(&e));
            }
        });
        let c = &client;
        let (latest, count, cloud, rows_1, rows_6, rows_7) = tokio::try_join!(
            c.prepare(SQL_LATEST),
            c.prepare(SQL_COUNT),
            c.prepare(SQL_CLOUD),
            c.prepare(SQL_ROWS_1),
            c.prepare(SQL_ROWS_6),
            c.prepare(SQL_ROWS_7),
        )?;
        Ok(PgConn {
            client,
            latest,
            count,
            cloud,
            rows_1,
            rows_6,
            rows_7,
        })
    }
}

/// One of the fixed connections.
struct Slot {
    conn: RwLock<Arc<PgConn>>,
    /// Held while the connection is made again; holds when the last attempt failed, so
    /// that a server that is down is tried at most once a second.
    reconnect: tokio::sync::Mutex<Option<Instant>>,
}

/// The `--db-connections` clients, handed out round-robin.
struct Db {
    config: tokio_postgres::Config,
    slots: Vec<Slot>,
    next: AtomicUsize,
}

impl Db {
    /// Parses `url`, and makes the `n` connections with their statements: a server that
    /// cannot be reached, a refused login or a database without frontpage's tables stops
    /// the start.
    async fn open(url: &str, n: usize) -> Result<Db, String> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| format!("--database: {e}"))?;
        if config.get_user().is_none() {
            // libpq's default, and frontpage's: the process's user name.
            let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
                .ok()
                .flatten()
                .ok_or("--database: no user in it, and cannot find this process's user name")?;
            config.user(user.name);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        let mut slots = Vec::with_capacity(n);
        for _ in 0..n {
            let conn = PgConn::connect(&config).await.map_err(|e| {
                let mut why = format!("--database: {}", describe(&e));
                if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) {
                    why.push_str(
                        " (the database has no frontpage tables: run appsrv's frontpage example \
                         on it once, which loads the schema and the seed data)",
                    );
                }
                why
            })?;
            slots.push(Slot {
                conn: RwLock::new(Arc::new(conn)),
                reconnect: tokio::sync::Mutex::new(None),
            });
        }
        Ok(Db {
            config,
            slots,
            next: AtomicUsize::new(0),
        })
    }

    /// Runs the read `f` on the next connection. A connection found gone is made again and
    /// the read runs once more on the new one (a read may run twice); a failure then is a
    /// 503.
    async fn read<T, F, Fut>(&self, f: F) -> Result<T, Failure>
    where
        F: Fn(Arc<PgConn>) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let slot = &self.slots[self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len()];
        let conn = self.conn(slot).await?;
        match f(Arc::clone(&conn)).await {
            Ok(v) => Ok(v),
            Err(e) if lost(&e) || conn.client.is_closed() => {
                eprintln!("axum-peer: a PostgreSQL connection lost: {}", describe(&e));
                let conn = self.conn(slot).await?;
                f(Arc::clone(&conn)).await.map_err(|e| failure(&e, &conn))
            }
            Err(e) => Err(Failure::Internal(describe(&e))),
        }
    }

    /// The slot's connection, made again first if it is closed.
    async fn conn(&self, slot: &Slot) -> Result<Arc<PgConn>, Failure> {
        let current = Arc::clone(&slot.conn.read().expect("not poisoned"));
        if !current.client.is_closed() {
            return Ok(current);
        }
        let mut failed_at = slot.reconnect.lock().await;
        // Another request may have made it while this one waited for the lock.
        let current = Arc::clone(&slot.conn.read().expect("not poisoned"));
        if !current.client.is_closed() {
            return Ok(current);
        }
        if failed_at.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return Err(Failure::Unavailable);
        }
        match PgConn::connect(&self.config).await {
            Ok(conn) => {
                eprintln!("axum-peer: a PostgreSQL connection made again");
                let conn = Arc::new(conn);
                *slot.conn.write().expect("not poisoned") = Arc::clone(&conn);
                *failed_at = None;
                Ok(conn)
            }
            Err(e) => {
                eprintln!("axum-peer: cannot connect to PostgreSQL: {}", describe(&e));
                *failed_at = Some(Instant::now());
                Err(Failure::Unavailable)
            }
        }
    }
}

/// The failure of a query on `conn`: 503 when the connection is gone, else 500.
fn failure(e: &tokio_postgres::Error, conn: &PgConn) -> Failure {
    if lost(e) || conn.client.is_closed() {
        Failure::Unavailable
    } else {
        Failure::Internal(describe(e))
    }
}

/// Whether a PostgreSQL error means the connection is gone (frontpage's test): closed, an
/// I/O error, SQLSTATE class 08, 57P01–57P03 (shutting down or starting) or 53300.
fn lost(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        None => {
            e.is_closed()
                || std::error::Error::source(e).is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some())
        }
        Some(code) => {
            let c = code.code();
            c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03" | "53300")
        }
    }
}

/// An error with its cause (tokio-postgres's Display leaves the server's message in the
/// source).
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => match std::error::Error::source(e) {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        },
    }
}
