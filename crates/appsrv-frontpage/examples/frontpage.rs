//! An application front page on a real database: the work an application server exists
//! for, and where a preforking server with per-worker state is at its best.
//!
//! Run it:
//!
//! ```text
//! cargo run --release --example frontpage        # SQLite: ./frontpage-data/frontpage.db
//! cargo run --release --example frontpage -- --database 'postgres:///frontpage?host=/var/run/postgresql'
//! # async mode (issue 33): PostgreSQL from event workers, two connections each
//! cargo run --release --example frontpage -- --database 'postgres:///frontpage?host=/var/run/postgresql' \
//!     --io event -w 2 --db-connections 2
//! ```
//!
//! Then, from another terminal:
//!
//! ```text
//! $ curl -s http://127.0.0.1:8090/ | head       # the front page: latest items, a count, a tag cloud
//! $ curl -s 'http://127.0.0.1:8090/rows?n=36'   # a table of 36 rows × 6 columns
//! $ curl -s http://127.0.0.1:8090/item/7        # one item (its title shows the HTML escaping)
//! $ echo 'a-long-random-secret-token' >token; chmod 600 token   # then restart with:
//!   cargo run --release --example frontpage -- --api-token-file token
//! $ curl -s -H 'Authorization: Bearer a-long-random-secret-token' -H 'Content-Type: application/json' \
//!     -d '{"title":"Hello","body":"First post","author_id":1,"tags":["rust","sqlite"]}' \
//!     http://127.0.0.1:8090/item                 # 201 Created, Location: /item/501
//! $ ab -n 50000 -c 32 -k http://127.0.0.1:8090/ # or bench/frontpage.sh, against PHP
//! $ bench/axum/check.sh http://127.0.0.1:8090 http://127.0.0.1:8080   # the same bytes as axum-peer
//! ```
//!
//! ## Routes
//!
//! - `GET /`: an HTML page from three queries: the 20 latest items with their authors (a
//!   join), the number of items (an aggregate), and a cloud of the 20 most used tags (a
//!   join and a `GROUP BY`), each tag weighted 1 to 5.
//! - `GET /rows?n=N`, N from 1 to 1000: an HTML table of the first N items, one `<tr>` per
//!   row: 1 column up to N = 5, 6 columns up to 36, 7 beyond (the origin benchmark's 5 × 1,
//!   36 × 6 and 134 × 7). A missing, non-numeric or out-of-range N is `400`.
//! - `GET /item/ID`: one item, or `404`.
//! - `POST /item`: inserts an item and its tags in one transaction. Authorised by
//!   `Authorization: Bearer TOKEN`, the token read from `--api-token-file` at start and on
//!   `reload` (missing or wrong token, or no token file: `401`; with `--exec-workers`, each
//!   worker reads the file when it starts). A wrong token is a failed authentication
//!   (`Conn::penalize`): the connection ends after the `401`, which says for how long
//!   (`Retry-After`), and the client's address is refused new connections by every worker
//!   for 1 s, then 2 s, 4 s ... with each failure in a row, at most `--penalty-max`. The body is JSON,
//!   `{"title": "…", "body": "…", "author_id": N, "tags": ["…"]}` (`Content-Type:
//!   application/json`, else `415`); a bad body (not JSON, an unknown field, an empty or
//!   overlong title, an unknown author or tag, a repeated tag, a tag of more than 64
//!   characters or with a control character) is `400` with the reason,
//!   and nothing is written. Success is `201 Created` with `Location: /item/ID` and
//!   `{"id":ID}`.
//! - Other methods get `405` with `Allow`; other paths `404`. `HEAD` works wherever `GET`
//!   does. A database that cannot be reached or stays locked gets `503` with `Retry-After:
//!   1`, and the worker goes on; any other database error is `500`, logged.
//!
//! Pages are deterministic: the same data gives the same bytes (no time, no worker number
//! on them), so `ab` counts no length differences as failures.
//!
//! ## Databases
//!
//! `--database sqlite:PATH` (the default, `sqlite:frontpage-data/frontpage.db`, needs
//! nothing installed: the SQLite library is built into the example). The **master**
//! creates the file on first start with the schema and 500 items of seed data, in WAL mode
//! (readers never wait for the writer), and closes it before it forks: a SQLite connection
//! must never cross a `fork`. WAL keeps `-wal` and `-shm` files beside the database, so
//! the directory must be writable by the workers: when the master starts as root and the
//! workers run as `--user` (default `nobody`), a directory it creates (mode 0750) is given
//! to that user, and the file is created (mode 0640), opened and filled as that user, so
//! that a link the workers' user planted in its own directory cannot make root write
//! elsewhere; a directory or file the workers cannot reach stops the start with a message
//! (`check` says so too). The path is the master's: `--chroot` is not supported with SQLite.
//! Writes run in `BEGIN IMMEDIATE`, and a connection waits up to `--db-busy-timeout`
//! (5000 ms) for the write lock before the request gets 503.
//!
//! `--database postgres://…` (or `postgresql://`, libpq's URL form: `postgres:///DB?host=
//! /var/run/postgresql` for the local socket) uses a PostgreSQL server. The same schema and
//! seed data are loaded by the first worker that finds the database empty (under an
//! advisory lock); the master never talks to PostgreSQL, because the client (tokio-postgres)
//! runs on a Tokio runtime, and the master stays single-threaded. Each worker builds a
//! current-thread runtime (no thread) and blocks on it for each query, or, in async mode
//! (below), runs its queries on its event loop's runtime; the front page's three queries
//! are sent together and answered in one round trip (pipelined). Without a user in the URL the
//! workers connect as their own user name, as `psql` does; with peer authentication that
//! role is the workers' OS user, which shows that the connection was made after the
//! privilege drop: create the role and its database with `createuser nobody; createdb -O
//! nobody frontpage` (as the `postgres` user; the role must be able to create tables in
//! the database's `public` schema, which PostgreSQL 15 gives only to its owner). A lost
//! connection (a server restart, a network failure) is dropped and made again by a later
//! request, at most once a second; requests meanwhile get 503. A page whose connection
//! turns out to be gone (a session the server ended while the worker was idle) is read
//! again at once on a new one, so it costs nothing; a write is not repeated (whether a lost
//! COMMIT took effect cannot be known) and gets 503. A server that cannot be
//! reached when a worker starts does not stop that worker (it starts without a connection,
//! says why in the log, and answers 503 until it connects), so a pool replaced during an
//! outage keeps answering; authentication or a missing database stops the start. A host
//! name is resolved on a blocking thread of the worker's runtime (an IP address or the
//! socket directory needs none: no thread at all). No TLS
//! to the database (`NoTls`): use the local socket or a trusted network. A password is
//! better given in `FRONTPAGE_DATABASE` than on the command line, which other users can
//! read in `/proc`; logs show it as `***`.
//!
//! ## Per-worker state, and why the factory makes it
//!
//! Each worker keeps, for its whole life, what PHP rebuilds or borrows on every request:
//! its own database connection (PHP-FPM's persistent connections are the nearest thing),
//! its prepared statements (prepared once per connection, not once per request), and its
//! compiled templates. They are made in the handler factory, which runs in each worker
//! after the fork, the privilege drop and `--sandbox`:
//!
//! - a connection opened before `fork` would be shared by every worker (a socket that
//!   several processes write to, a SQLite file handle whose locks belong to the process);
//! - the connection is made by the workers' user, not by root, so the database sees (and
//!   peer authentication checks) the least privileged identity;
//! - the PostgreSQL client's runtime is built in the process that uses it, after the fork
//!   (a runtime does not survive one): by the factory in blocking mode, by appsrv for the
//!   worker's event loop in async mode;
//! - a failure (no such file, a refused login, a schema mismatch) stops the start with the
//!   reason, before the server reports itself ready.
//!
//! ## Blocking or async mode
//!
//! This example runs `--io blocking` by default: every query blocks its worker until the
//! database answers, and in blocking mode that holds up only the one connection the worker
//! serves. Size that pool for the database: enough workers to keep it busy (about twice
//! the cores it can use), not one per client; the pool grows with `--max-workers` when
//! clients queue. `--io hybrid` serves the same handler from blocking workers behind event
//! loops that hold the idle connections.
//!
//! **Async mode** (issue 33): with PostgreSQL, `--io event` runs the pages through an
//! [`AsyncRequestHandler`](appsrv::AsyncRequestHandler) instead
//! ([`Server::run_async_requests`](appsrv::Server::run_async_requests)). Each event worker
//! runs a current-thread tokio runtime, made after the fork, with every connection a future
//! of it: a request that waits for PostgreSQL holds no process, and the worker serves its
//! other connections meanwhile. Each worker keeps `--db-connections` tokio-postgres
//! connections (default 2; `FRONTPAGE_DB_CONNECTIONS`), each with its statements prepared
//! once, handed to the requests round-robin and shared by all of them at once: the queries
//! of the requests in flight on a connection are pipelined (sent without waiting for the
//! answers before them), so no request waits for a free connection (`frontpage/pool.rs`).
//! The pages are the same bytes, from the same code: the handler routes and checks a
//! request (`route`), runs its `Query` (blocking on the worker's client runtime, or
//! awaiting on the event loop's), and renders the `Answer` (`respond`). The same
//! statuses too: 503 with `Retry-After: 1` while the database is unreachable, a lost
//! connection made again by the next request that picks it (at most once a second while
//! the server is down), a read whose connection turns out gone run again on a new one, a
//! write never repeated. An insert is one statement (one implicit transaction) in both
//! modes on PostgreSQL, since a connection shared by concurrent requests cannot hold a
//! `BEGIN … COMMIT` for one of them.
//!
//! Why two connections per worker: PostgreSQL runs a session's queries one at a time, in
//! one backend process, so one connection lets a worker keep at most one of the server's
//! CPUs busy, however many requests it holds; two let the queries of one worker run while
//! it renders the pages of others (on a 2-CPU machine with 2 workers, smoke figures: the
//! front page 1.2 to 2 times as fast with 2 connections as with 1, no clear gain from 4 or
//! 8).
//! With a worker per CPU (the default `-w`) that is two backends per core, the blocking
//! mode's sizing; more connections multiply backends (memory, `max_connections`) for
//! nothing once the database's CPUs are busy.
//!
//! What to observe: `ab -k -c 256 …` against `-w 2 --io event` is answered by two
//! processes, where the blocking mode needs a worker per client in flight; `status` shows
//! the requests in flight per worker; `SELECT count(*) FROM pg_stat_activity WHERE usename
//! = 'nobody'` shows `-w` × `--db-connections` sessions, whatever the load; a
//! `pg_terminate_backend` of them costs the next reads nothing, and a database restart
//! gets 503s, then pages, from the same workers. `--max-inflight` and `--request-timeout`
//! (504) apply as to any async handler.
//!
//! Two things differ. The worker's runtime does not exist yet when the handler factory
//! runs, and a connection belongs to the runtime that drives its socket: the factory makes
//! a blocking-mode connection on a runtime of its own (which finds what would stop the
//! start, and loads the schema into an empty database), closes it, and the pool's
//! connections are made by the first requests. And at a stop the runtime is gone before
//! `on_worker_exit`, so the sessions are closed without a goodbye (the server sees its
//! clients go). SQLite has no async client: under `--io event` its blocking handler runs
//! in the event loop, as it always has, each query (sub-millisecond, from a local file)
//! holding up the worker's other connections; `--db-connections` is for async mode only.
//!
//! With `--sandbox`, workers may write the SQLite database's directory (and nothing else on
//! disk), or, for PostgreSQL, create sockets and connect (`socket`, `connect`). They read
//! no file then, so a PostgreSQL host must be an IP address or the socket directory: a
//! host name needs the resolver's files (`/etc/hosts`, `/etc/resolv.conf`).

use std::cell::RefCell;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use appsrv::codec::{Http, HttpRequest, HttpResponse};
use serde::Deserialize;

#[path = "frontpage/db.rs"]
mod db;
#[path = "frontpage/pages.rs"]
mod pages;
#[path = "frontpage/pool.rs"]
mod pool;

use db::{Answer, Database, Failure, Query};

#[derive(clap::Args, Debug)]
struct Args {
    /// The database: sqlite:PATH, or postgres://USER@HOST/DB (libpq's URL form)
    #[arg(
        long,
        value_name = "URL",
        default_value = "sqlite:frontpage-data/frontpage.db"
    )]
    database: String,

    /// Read the API token that authorises POST /item from FILE (at start and on reload);
    /// without it, POST /item answers 401
    #[arg(long, value_name = "FILE")]
    api_token_file: Option<PathBuf>,

    /// How long a SQLite connection waits for the write lock before the request gets 503,
    /// in milliseconds
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    db_busy_timeout: u64,

    /// Async mode (PostgreSQL with --io event): PostgreSQL connections per worker, each
    /// shared by the requests in flight (their queries pipelined), used round-robin. The
    /// blocking mode has one per worker
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    db_connections: u16,
}

/// The command line: the example's own options, and the I/O model the server's `--io` chose,
/// which decides the handler (the async one for PostgreSQL under `--io event`). `--io` is
/// appsrv's option, parsed into the same matches as the example's; `None` for the
/// subcommands that serve nothing (`stop`, `status`), whose matches do not have it.
#[derive(Debug)]
struct Options {
    args: Args,
    io: Option<appsrv::Io>,
}

impl clap::FromArgMatches for Options {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Ok(Options {
            args: Args::from_arg_matches(m)?,
            io: m.try_get_one::<appsrv::Io>("io").ok().flatten().copied(),
        })
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Options::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for Options {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        Args::augment_args(cmd)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Args::augment_args_for_update(cmd)
    }
}

/// The largest `n` of `/rows?n=N`.
const MAX_ROWS: i64 = 1000;
/// The largest POST body; a larger one is answered 413 by the codec.
const MAX_BODY: usize = 64 * 1024;
/// Limits on a new item's fields, in characters.
const MAX_TITLE: usize = 200;
const MAX_TEXT: usize = 10_000;
const MAX_TAGS: usize = 8;
const MAX_TAG: usize = 64;

/// One worker's handler in every mode but async (`--io blocking` and `hybrid`, and SQLite
/// under `--io event`): its database connection with its prepared statements, and the API
/// token it was started with. The pages' code is shared with [`AsyncFrontpage`]: [`route`], then the query, then
/// [`respond`].
struct Frontpage {
    /// `None` only after `on_worker_exit`, when no request comes any more.
    store: Option<db::Store>,
    token: Option<Rc<str>>,
}

impl appsrv::RequestHandler for Frontpage {
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
        match route(conn, self.token.as_deref(), req, res)? {
            Some(query) => {
                let store = self
                    .store
                    .as_mut()
                    .expect("the store is open until on_worker_exit");
                respond(res, store.run(&query))
            }
            None => Ok(()),
        }
    }

    /// Closes the connection in an orderly way: SQLite checkpoints its WAL (and removes it
    /// with the last connection), PostgreSQL's server sees a goodbye rather than a lost
    /// client.
    fn on_worker_exit(&mut self) {
        drop(self.store.take());
    }
}

/// One worker's handler in async mode (PostgreSQL under `--io event`): its few connections,
/// shared by every request in flight in the worker, and the API token it was started with.
struct AsyncFrontpage {
    pool: pool::Pool,
    token: Option<Rc<str>>,
}

impl appsrv::AsyncRequestHandler for AsyncFrontpage {
    type Codec = Http;
    type Session = ();

    fn codec(&self) -> Http {
        Http::new().max_body(MAX_BODY)
    }

    async fn handle_request(
        &self,
        conn: &mut appsrv::Conn<'_>,
        req: &HttpRequest<'_>,
        res: &mut HttpResponse<'_>,
    ) -> io::Result<()> {
        match route(conn, self.token.as_deref(), req, res)? {
            // Awaited on the worker's runtime: its other requests are served meanwhile.
            Some(query) => respond(res, self.pool.run(&query).await),
            None => Ok(()),
        }
    }
}

/// Routes a request and checks its input: the [`Query`] it needs, or `None` when it has
/// been answered already (405, 404, a bad `n`, a refused token or body).
fn route(
    conn: &mut appsrv::Conn<'_>,
    token: Option<&str>,
    req: &HttpRequest<'_>,
    res: &mut HttpResponse<'_>,
) -> io::Result<Option<Query>> {
    let read = matches!(req.method(), "GET" | "HEAD");
    let answered = match req.path() {
        "/" if read => return Ok(Some(Query::Front)),
        "/rows" if read => match rows_wanted(req) {
            Some(n) => return Ok(Some(Query::Rows(n))),
            None => plain(
                res,
                400,
                &format!("expected /rows?n=N with N from 1 to {MAX_ROWS}\n"),
            ),
        },
        "/item" if req.method() == "POST" => match post_item(conn, token, req, res)? {
            Some(new) => return Ok(Some(Query::Insert(new))),
            None => Ok(()),
        },
        "/" | "/rows" => not_allowed(res, "GET, HEAD"),
        "/item" => not_allowed(res, "POST"),
        path => match path.strip_prefix("/item/") {
            // Only plain decimal ids name an item; anything else names nothing.
            Some(id) if read => match Some(id)
                .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|id| id.parse::<i64>().ok())
            {
                Some(id) => return Ok(Some(Query::Item(id))),
                None => plain(res, 404, "no such item\n"),
            },
            Some(_) => not_allowed(res, "GET, HEAD"),
            None => plain(res, 404, "not found\n"),
        },
    };
    answered.map(|()| None)
}

/// The `n` of `/rows?n=N`: the first `n=` of the query, 1 to 4 digits, 1 to [`MAX_ROWS`].
fn rows_wanted(req: &HttpRequest<'_>) -> Option<i64> {
    req.query()
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix("n="))
        .filter(|n| !n.is_empty() && n.len() <= 4 && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse::<i64>().ok())
        .filter(|n| (1..=MAX_ROWS).contains(n))
}

/// `POST /item`'s token, type and body: the item to insert, or `None` when the request
/// has been refused (401, 415, 400).
fn post_item(
    conn: &mut appsrv::Conn<'_>,
    token: Option<&str>,
    req: &HttpRequest<'_>,
    res: &mut HttpResponse<'_>,
) -> io::Result<Option<db::NewItem>> {
    if let Err(why) = authorise(token, req.header_str("authorization")) {
        res.header("WWW-Authenticate", "Bearer realm=\"frontpage\"");
        // A wrong token is a guess: the client's address is refused new connections
        // for a while, across all workers (1 s, doubling with each failure in a row,
        // up to --penalty-max), and this connection ends after the 401. A request
        // without a token guessed nothing, and is not charged.
        if why == WRONG_TOKEN {
            if let Some(wait) = conn.penalize() {
                let secs = wait.as_secs_f64().ceil();
                res.header("Retry-After", secs.to_string());
                plain(
                    res,
                    401,
                    &format!(
                        "unauthorised: {why}; new connections from your address are refused for {secs} s\n"
                    ),
                )?;
                return Ok(None);
            }
        }
        plain(res, 401, &format!("unauthorised: {why}\n"))?;
        return Ok(None);
    }
    let json = req
        .header_str("content-type")
        .and_then(|t| t.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        plain(res, 415, "expected Content-Type: application/json\n")?;
        return Ok(None);
    }
    match parse_item(req.body()) {
        Ok(new) => Ok(Some(new)),
        Err(why) => plain(res, 400, &format!("bad item: {why}\n")).map(|()| None),
    }
}

/// Writes what the database answered: the page, or the failure's answer.
fn respond(res: &mut HttpResponse<'_>, answer: Result<Answer, Failure>) -> io::Result<()> {
    match answer {
        Ok(Answer::Front(front)) => html(res, &pages::FrontPage { front: &front }),
        Ok(Answer::Rows(table)) => html(res, &pages::RowsPage { table: &table }),
        Ok(Answer::Item(Some(item))) => html(res, &pages::ItemPage { item: &item }),
        Ok(Answer::Item(None)) => plain(res, 404, "no such item\n"),
        Ok(Answer::Inserted(id)) => {
            res.status(201)
                .header("Location", format!("/item/{id}"))
                .content_type("application/json");
            writeln!(res, "{{\"id\":{id}}}")
        }
        Err(f) => failure(res, f),
    }
}

/// A page as `text/html`.
fn html(res: &mut HttpResponse<'_>, page: &impl askama::Template) -> io::Result<()> {
    res.content_type("text/html; charset=utf-8");
    // (`Template::write_into`: askama's `FastWritable` has a method of the same name.)
    askama::Template::write_into(page, res)
}

/// Why [`authorise`] refuses a token that was presented and is not the one.
const WRONG_TOKEN: &str = "wrong token";

/// Checks `Authorization: Bearer TOKEN` against the configured token.
fn authorise(token: Option<&str>, header: Option<&str>) -> Result<(), &'static str> {
    let token = token.ok_or("no API token is configured (--api-token-file)")?;
    let given = header
        .and_then(|h| h.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim())
        .ok_or("expected Authorization: Bearer TOKEN")?;
    // Compared in time independent of where the first difference is.
    let same = given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if same { Ok(()) } else { Err(WRONG_TOKEN) }
}

/// The body of `POST /item`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ItemBody {
    title: String,
    body: String,
    author_id: i64,
    #[serde(default)]
    tags: Vec<String>,
}

/// Parses and checks a new item; the reason is for the 400 answer.
fn parse_item(body: &[u8]) -> Result<db::NewItem, String> {
    let item: ItemBody = serde_json::from_slice(body).map_err(|e| format!("not the expected JSON: {e}"))?;
    let title = item.title.trim();
    if title.is_empty() {
        return Err("title is empty".into());
    }
    if title.chars().count() > MAX_TITLE {
        return Err(format!("title is longer than {MAX_TITLE} characters"));
    }
    if title.chars().any(char::is_control) {
        return Err("title has a control character".into());
    }
    if item.body.chars().count() > MAX_TEXT {
        return Err(format!("body is longer than {MAX_TEXT} characters"));
    }
    if item
        .body
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err("body has a control character other than newline and tab".into());
    }
    if item.author_id < 1 {
        return Err(format!("unknown author_id {}", item.author_id));
    }
    if item.tags.len() > MAX_TAGS {
        return Err(format!("more than {MAX_TAGS} tags"));
    }
    for (i, tag) in item.tags.iter().enumerate() {
        if tag.is_empty() || tag.chars().count() > MAX_TAG || tag.chars().any(char::is_control) {
            return Err(format!(
                "tag {tag:?}: expected 1 to {MAX_TAG} characters, none a control character"
            ));
        }
        if item.tags[..i].contains(tag) {
            return Err(format!("tag {tag:?} given twice"));
        }
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    Ok(db::NewItem {
        title: title.to_owned(),
        body: item.body,
        author_id: item.author_id,
        tags: item.tags,
        created: db::format_time(now),
    })
}

/// The answer to a database failure.
fn failure(res: &mut HttpResponse<'_>, f: Failure) -> io::Result<()> {
    match f {
        Failure::Unavailable(why) => {
            tracing::debug!("503: {why}");
            res.header("Retry-After", "1");
            plain(res, 503, "the database is unavailable; try again\n")
        }
        // Only an insert is refused with a reason (an unknown author or tag).
        Failure::Invalid(why) => plain(res, 400, &format!("bad item: {why}\n")),
        Failure::Internal(why) => {
            tracing::error!("database error: {why}");
            plain(res, 500, "internal error\n")
        }
    }
}

fn not_allowed(res: &mut HttpResponse<'_>, allow: &str) -> io::Result<()> {
    res.header("Allow", allow);
    plain(res, 405, "method not allowed\n")
}

/// A short text/plain response.
fn plain(res: &mut HttpResponse<'_>, status: u16, text: &str) -> io::Result<()> {
    res.status(status).content_type("text/plain; charset=utf-8");
    res.write_all(text.as_bytes())
}

/// Reads the API token: the file's first line, at least 16 visible ASCII characters.
fn read_token(path: &Path) -> Result<Rc<str>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--api-token-file {}: {e}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim();
    if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "--api-token-file {}: the token (the file's first line) must be at least 16 visible \
             ASCII characters",
            path.display()
        ));
    }
    Ok(token.into())
}

/// `--database` made absolute (the daemon changes directory to `/`), and, for PostgreSQL
/// without a user in the URL, the workers' user name as its user (libpq's default is the
/// OS user; resolved here, in the master, where the user database may be read).
fn resolve_database(db: Database, workers: Option<&appsrv::WorkerIdentity>) -> appsrv::Result<Database> {
    Ok(match db {
        Database::Sqlite(path) => Database::Sqlite(
            std::path::absolute(&path)
                .map_err(|e| appsrv::Error::Config(format!("--database {}: {e}", path.display())))?,
        ),
        Database::Postgres(url) => {
            let config: tokio_postgres::Config = url
                .parse()
                .map_err(|e| appsrv::Error::Config(format!("--database: {e}")))?;
            if config.get_user().is_some() {
                return Ok(Database::Postgres(url));
            }
            let user = match workers {
                Some(w) => w.user.clone(),
                None => nix::unistd::User::from_uid(nix::unistd::geteuid())
                    .ok()
                    .flatten()
                    .map(|u| u.name)
                    .ok_or_else(|| {
                        appsrv::Error::Config("--database: cannot find this process's user name".into())
                    })?,
            };
            let sep = if url.contains('?') { '&' } else { '?' };
            Database::Postgres(format!("{url}{sep}user={user}"))
        }
    })
}

fn main() {
    serve().unwrap_or_else(|e| e.exit());
}

fn serve() -> appsrv::Result<()> {
    let mut server = appsrv::server!("frontpage")
        .about("An application front page on SQLite or PostgreSQL: per-worker connections, statements and templates")
        .listen("127.0.0.1:8090");
    let Options { args, io } = server.args();
    let sub = server.subcommand().unwrap_or("run").to_owned();
    let serving = matches!(sub.as_str(), "run" | "start");
    let workers = server.worker_identity()?;
    // Parsed here rather than by clap, whose message would quote the URL, password and
    // all; and only by the processes that use it (`stop` and `status` get the variable
    // FRONTPAGE_DATABASE from a unit file too).
    let uses_database = matches!(sub.as_str(), "run" | "start" | "check" | "worker");
    let database = if uses_database {
        let parsed = args
            .database
            .parse::<Database>()
            .map_err(|e| appsrv::Error::Config(format!("--database {e}")))?;
        resolve_database(parsed, workers.as_ref())?
    } else {
        Database::Sqlite(PathBuf::new())
    };
    let token_file = args.api_token_file.map(|p| std::path::absolute(&p).unwrap_or(p));
    // Read by the processes that serve or check, only: `stop` and `status` must work
    // whatever the file holds (a unit file gives FRONTPAGE_API_TOKEN_FILE to every one of
    // them). A worker `--exec-workers` started again reads the file itself.
    let token = match &token_file {
        Some(path) if uses_database => Some(read_token(path).map_err(appsrv::Error::Config)?),
        _ => None,
    };
    if serving {
        // Here, in the master, before anything is bound or the daemon detaches: a database
        // that cannot be created or that the workers could not write stops the start.
        db::prepare(&database, workers.as_ref())
            .map_err(|e| appsrv::Error::Config(format!("--database {e}")))?;
        if token.is_none() {
            tracing::info!("no --api-token-file: POST /item answers 401");
        }
    }
    let mut profile = appsrv::Sandbox::new();
    match &database {
        Database::Sqlite(path) => {
            if let Some(dir) = path.parent() {
                profile = profile.write(dir);
            }
        }
        Database::Postgres(_) => {
            profile = profile
                .allow_syscall(libc::SYS_socket)
                .allow_syscall(libc::SYS_connect);
        }
    }
    // The token the workers of the next generation get: read again on reload, so a
    // rotated token takes effect without a restart (a bad one fails the reload).
    let current = Rc::new(RefCell::new(token));
    let reloaded = Rc::clone(&current);
    let busy = Duration::from_millis(args.db_busy_timeout);
    let (checked, identity) = (database.clone(), workers.clone());
    let server = server
        .sandbox(profile)
        .on_check(move || {
            // What `run` would refuse, found without creating anything.
            db::check(&checked, identity.as_ref()).map_err(|e| format!("--database {e}").into())
        })
        .on_reload(move || {
            if let Some(path) = &token_file {
                *reloaded.borrow_mut() = Some(read_token(path)?);
            }
            Ok(())
        });
    match (&database, io) {
        // Async mode: PostgreSQL's client is async, and event workers run it on their own
        // runtime. (SQLite has no async client: under `--io event` its blocking handler runs
        // in the event loop, as it always has, each query holding up the worker's loop.)
        (Database::Postgres(_), Some(appsrv::Io::Event)) => {
            let connections = usize::from(args.db_connections);
            if serving {
                tracing::info!(
                    "async mode: PostgreSQL from the event workers' runtimes, {connections} \
                     pipelined connection(s) per worker"
                );
            }
            server.run_async_requests(move || {
                // The factory runs before the worker's runtime exists, and a connection
                // belongs to the runtime that drives it: the pool's connections are made by
                // the first requests. What would stop a start (a refused login, no such
                // database, a schema that does not match) is found here, with the blocking
                // mode's connection on a runtime of its own, closed at once; it loads the
                // schema and seed data into an empty database too.
                drop(db::open(&database, busy)?);
                Ok(AsyncFrontpage {
                    pool: pool::Pool::new(&database, connections)?,
                    token: current.borrow().clone(),
                })
            })
        }
        _ => server.run_requests(move || {
            Ok(Frontpage {
                store: Some(db::open(&database, busy)?),
                token: current.borrow().clone(),
            })
        }),
    }
}
