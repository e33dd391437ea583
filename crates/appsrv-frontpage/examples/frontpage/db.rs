//! The front page's data: one schema and one set of seed data on SQLite and PostgreSQL,
//! the queries each page runs, and what a failure means for the client (503, 400, 500).
//!
//! In blocking mode each worker holds one [`Store`]: its own database connection and its
//! prepared statements, made by the handler factory after the fork and the privilege drop,
//! and kept for the worker's life. In async mode (PostgreSQL, `--io event`) it holds a few
//! [`PgConn`]s instead (`pool.rs`), which run the same queries ([`PgConn::run`]) on the
//! worker's runtime. SQLite's statements live in rusqlite's per-connection statement cache
//! (prepared on first use, then found by their text); PostgreSQL's are prepared on the
//! server once per connection, and prepared again after a reconnection.
//!
//! A request's work is a [`Query`] (routed and checked by the handler), and its result an
//! [`Answer`] or a [`Failure`]: the handler renders either, in either mode.
//!
//! The SQL text is shared: `$1` is PostgreSQL's placeholder, and SQLite reads `$1` as a
//! named parameter that takes the next position, which is the same thing for statements
//! that use each parameter once, in order.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Which database, from `--database`.
#[derive(Debug, Clone)]
pub(crate) enum Database {
    /// `sqlite:PATH`: one file, in WAL mode.
    Sqlite(PathBuf),
    /// `postgres://…` or `postgresql://…` (libpq's URL form, parsed by tokio-postgres).
    Postgres(String),
}

impl std::str::FromStr for Database {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err("sqlite: needs a file name (sqlite:PATH)".into());
            }
            return Ok(Database::Sqlite(PathBuf::from(path)));
        }
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            // Parsed now so that a bad URL stops the server at start, with the reason.
            s.parse::<tokio_postgres::Config>()
                .map_err(|e| format!("{}: {e}", redact(s)))?;
            return Ok(Database::Postgres(s.to_owned()));
        }
        Err(format!(
            "{}: expected sqlite:PATH, postgres://… or postgresql://…",
            redact(s)
        ))
    }
}

impl fmt::Display for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            Database::Postgres(url) => f.write_str(&redact(url)),
        }
    }
}

/// A URL with its password (`user:PASSWORD@`, and a `password=` parameter) replaced, for
/// logs and error messages.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{user}:***@{host}")
        }
        _ => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let params: Vec<&str> = query
                .split('&')
                .map(|p| {
                    if p.starts_with("password=") {
                        "password=***"
                    } else {
                        p
                    }
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// Why a page could not be made, and so what the client gets.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The database cannot be reached or is busy: 503 with `Retry-After`, the worker goes
    /// on (and reconnects on a later request).
    Unavailable(String),
    /// The client's input is refused (an unknown author or tag): 400 with the reason,
    /// nothing written.
    Invalid(String),
    /// Anything else (a bug, a schema that does not match): 500, logged.
    Internal(String),
}

/// An item in a list: the front page's latest items.
#[derive(Debug, Serialize)]
pub(crate) struct Latest {
    pub(crate) id: i64,
    pub(crate) title: String,
    pub(crate) author: String,
    pub(crate) created: String,
    pub(crate) score: i64,
}

/// A tag of the cloud, with its number of items and its weight (1 to 5, for the CSS class).
#[derive(Debug, Serialize)]
pub(crate) struct Tag {
    pub(crate) name: String,
    pub(crate) count: i64,
    pub(crate) weight: i64,
}

/// What the front page shows: three queries.
#[derive(Debug, Serialize)]
pub(crate) struct Front {
    pub(crate) latest: Vec<Latest>,
    pub(crate) count: i64,
    pub(crate) cloud: Vec<Tag>,
}

/// One item, for `/item/ID`.
#[derive(Debug, Serialize)]
pub(crate) struct Item {
    pub(crate) id: i64,
    pub(crate) title: String,
    pub(crate) body: String,
    pub(crate) score: i64,
    pub(crate) created: String,
    pub(crate) author: String,
    pub(crate) email: String,
}

/// A table for `/rows`: the column names and the rows, as text.
#[derive(Debug, Serialize)]
pub(crate) struct Table {
    pub(crate) header: &'static [&'static str],
    pub(crate) rows: Vec<Vec<String>>,
}

/// An item to insert (`POST /item`), already checked for shape by the caller.
#[derive(Debug)]
pub(crate) struct NewItem {
    pub(crate) title: String,
    pub(crate) body: String,
    pub author_id: i64,
    pub(crate) tags: Vec<String>,
    pub(crate) created: String,
}

// The limits are written in the statements, or cast: SQLite uses a LIMIT's bound integer
// when it plans (it sets the parameter's bit in the statement's `expmask`), and then binding
// it again, even to the same value, expires the statement, which is parsed and planned again
// at its next step: a prepared statement in name only. A CAST is not an integer to the
// planner, so `LIMIT CAST($1 AS BIGINT)` keeps the plan; PostgreSQL reads it as a bigint.
const SQL_LATEST: &str = "SELECT i.id, i.title, a.name, i.created, i.score FROM items i \
     JOIN authors a ON a.id = i.author_id ORDER BY i.id DESC LIMIT 20";
const SQL_COUNT: &str = "SELECT COUNT(*) FROM items";
// The cloud counts in the index of item_tags by tag (a covering scan, grouped as it is
// ordered), then joins the names of the 20 largest: grouping the join by name instead
// costs SQLite a search per tag and a sort, 2.5 times as long.
const SQL_CLOUD: &str = "SELECT t.name, c.n FROM (SELECT tag_id, COUNT(*) AS n FROM item_tags GROUP BY tag_id) c \
     JOIN tags t ON t.id = c.tag_id ORDER BY c.n DESC, t.id LIMIT 20";
const SQL_ITEM: &str = "SELECT i.id, i.title, i.body, i.score, i.created, a.name, a.email FROM items i \
     JOIN authors a ON a.id = i.author_id WHERE i.id = $1";
const SQL_ROWS_1: &str = "SELECT title FROM items ORDER BY id LIMIT CAST($1 AS BIGINT)";
const SQL_ROWS_6: &str = "SELECT i.id, i.title, a.name, a.email, i.score, i.created FROM items i \
     JOIN authors a ON a.id = i.author_id ORDER BY i.id LIMIT CAST($1 AS BIGINT)";
const SQL_ROWS_7: &str = "SELECT i.id, i.title, a.name, a.email, i.score, i.created, i.body FROM items i \
     JOIN authors a ON a.id = i.author_id ORDER BY i.id LIMIT CAST($1 AS BIGINT)";
const SQL_AUTHOR: &str = "SELECT id FROM authors WHERE id = $1";
const SQL_TAG: &str = "SELECT id FROM tags WHERE name = $1";
const SQL_INSERT_ITEM: &str =
    "INSERT INTO items (author_id, title, body, score, created) VALUES ($1, $2, $3, 0, $4) RETURNING id";
const SQL_INSERT_TAG: &str = "INSERT INTO item_tags (item_id, tag_id) VALUES ($1, $2)";

/// The column names of `/rows?n=N`: one column up to 5 rows, six up to 36, seven beyond
/// (the seed benchmark's 5 × 1, 36 × 6 and 134 × 7).
pub(crate) fn columns(n: i64) -> &'static [&'static str] {
    match n {
        ..=5 => &["title"],
        6..=36 => &["id", "title", "author", "email", "score", "created"],
        _ => &["id", "title", "author", "email", "score", "created", "body"],
    }
}

fn rows_sql(n: i64) -> &'static str {
    match columns(n).len() {
        1 => SQL_ROWS_1,
        6 => SQL_ROWS_6,
        _ => SQL_ROWS_7,
    }
}

/// The cloud's weight of a tag with `count` items when the largest has `max`: 1 to 5.
fn weight(count: i64, max: i64) -> i64 {
    1 + 4 * count / max.max(1)
}

fn cloud(tags: Vec<(String, i64)>) -> Vec<Tag> {
    let max = tags.iter().map(|t| t.1).max().unwrap_or(1);
    tags.into_iter()
        .map(|(name, count)| Tag {
            weight: weight(count, max),
            name,
            count,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// The schema and the seed data.

const SQLITE_SCHEMA: &str = "
CREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL);
CREATE TABLE items (
    id INTEGER PRIMARY KEY,
    author_id INTEGER NOT NULL REFERENCES authors (id),
    title TEXT NOT NULL,
    body TEXT NOT NULL,
    score INTEGER NOT NULL,
    created TEXT NOT NULL
);
CREATE INDEX items_author ON items (author_id);
CREATE TABLE tags (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE item_tags (
    item_id INTEGER NOT NULL REFERENCES items (id),
    tag_id INTEGER NOT NULL REFERENCES tags (id),
    PRIMARY KEY (item_id, tag_id)
);
CREATE INDEX item_tags_tag ON item_tags (tag_id);
";

/// The same tables in PostgreSQL's words: 64-bit integers (SQLite's are), and identity
/// columns where SQLite assigns the next rowid.
const POSTGRES_SCHEMA: &str = "
CREATE TABLE authors (id BIGINT PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL);
CREATE TABLE items (
    id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    author_id BIGINT NOT NULL REFERENCES authors (id),
    title TEXT NOT NULL,
    body TEXT NOT NULL,
    score BIGINT NOT NULL,
    created TEXT NOT NULL
);
CREATE INDEX items_author ON items (author_id);
CREATE TABLE tags (id BIGINT PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE item_tags (
    item_id BIGINT NOT NULL REFERENCES items (id),
    tag_id BIGINT NOT NULL REFERENCES tags (id),
    PRIMARY KEY (item_id, tag_id)
);
CREATE INDEX item_tags_tag ON item_tags (tag_id);
";

/// How many seed items, authors and tags.
pub(crate) const SEED_ITEMS: i64 = 500;
const FIRST: [&str; 5] = ["Ada", "Brian", "Chloé", "Dennis", "Edsger"];
const LAST: [&str; 5] = ["Lovelace", "Kernighan", "O'Neil", "Ritchie", "Dijkstra"];
const TAGS: [&str; 30] = [
    "rust",
    "sqlite",
    "postgres",
    "http",
    "unix",
    "fork",
    "epoll",
    "tls",
    "dns",
    "xml",
    "json",
    "php",
    "apache",
    "nginx",
    "redis",
    "kernel",
    "signals",
    "sockets",
    "memory",
    "latency",
    "threads",
    "daemons",
    "logging",
    "metrics",
    "security",
    "privileges",
    "seccomp",
    "landlock",
    "systemd",
    "haproxy",
];
const ADJECTIVES: [&str; 8] = [
    "Fast", "Small", "Quiet", "Robust", "Plain", "Careful", "Lazy", "Strict",
];
const NOUNS: [&str; 9] = [
    "servers",
    "workers",
    "queries",
    "sockets",
    "pages",
    "templates",
    "daemons",
    "caches",
    "pools",
];

/// The seed's authors: `(id, name, email)`. Some names need HTML escaping (an apostrophe).
fn seed_authors() -> Vec<(i64, String, String)> {
    let mut out = Vec::new();
    for (i, first) in FIRST.iter().enumerate() {
        for (j, last) in LAST.iter().enumerate() {
            let id = (i * LAST.len() + j + 1) as i64;
            let email = format!(
                "{}.{}@example.org",
                first.to_lowercase().replace('é', "e"),
                last.to_lowercase().replace('\'', "")
            );
            out.push((id, format!("{first} {last}"), email));
        }
    }
    out
}

/// Seed item `i` (1-based): `(author_id, title, body, score, created)`. Deterministic, so
/// that every database gets the same data and every server the same pages. Every seventh
/// title holds characters that HTML must escape.
fn seed_item(i: i64) -> (i64, String, String, i64, String) {
    let authors = (FIRST.len() * LAST.len()) as i64;
    let author_id = (i * 7) % authors + 1;
    let adj = ADJECTIVES[(i % ADJECTIVES.len() as i64) as usize];
    let noun = NOUNS[((i / 3) % NOUNS.len() as i64) as usize];
    let title = if i % 7 == 0 {
        format!("{adj} {noun} & <em>\"markup\"</em>, part {i}")
    } else {
        format!("{adj} {noun}, part {i}")
    };
    let body = format!(
        "Notes on {} {} number {i}: what they cost, and why it matters.",
        adj.to_lowercase(),
        noun
    );
    let score = (i * 37) % 101;
    (author_id, title, body, score, seed_time(i))
}

/// The seed's tags of item `i`: one to three tag ids, distinct.
fn seed_item_tags(i: i64) -> Vec<i64> {
    let n = TAGS.len() as i64;
    let mut tags = vec![(i * 5) % n + 1];
    for t in [(i * 11) % n + 1, (i * i) % n + 1] {
        if !tags.contains(&t) && (tags.len() < 2 || i % 3 == 0) {
            tags.push(t);
        }
    }
    tags
}

/// The creation time of seed item `i`: seven hours apart from 2026-01-01 00:00 UTC, as
/// text (`YYYY-MM-DD HH:MM`), so that no database formats it differently.
fn seed_time(i: i64) -> String {
    format_time(1_767_225_600 + i * 7 * 3600)
}

/// `YYYY-MM-DD HH:MM` (UTC) of a Unix time.
pub(crate) fn format_time(unix: i64) -> String {
    let (days, secs) = (unix.div_euclid(86_400), unix.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}",
        secs / 3600,
        secs % 3600 / 60
    )
}

// ---------------------------------------------------------------------------------------
// In the master: SQLite's file, created and filled before any worker starts.

/// Prepares the database in the master, before the fork: for SQLite, creates the file with
/// its schema and seed data if it has none (WAL mode is a property of the file, set once).
/// The connection is closed before this returns: a SQLite connection must not cross a
/// `fork`.
///
/// When the workers run as another user, WAL's `-wal` and `-shm` files beside the database
/// must be theirs to write, so the directory is theirs: a missing one is made by the master
/// (mode 0750) and given to them. Everything else is done **as the workers' user**: the
/// master switches its effective identity to theirs for the duration. Their directory is
/// theirs to change, so root must not create, open or chown anything in it by name: a link
/// planted there (`frontpage.db -> /etc/ld.so.preload`) would have root create that file
/// and hand it over. As the workers, the kernel checks what they may reach, including the
/// directories on the way; the file is created by them (mode 0640), so nothing is chowned.
///
/// PostgreSQL is left to the workers (see [`open`]): its client runs a Tokio runtime, which
/// has no place in the single-threaded master.
pub(crate) fn prepare(db: &Database, workers: Option<&appsrv::WorkerIdentity>) -> Result<(), String> {
    let Database::Sqlite(path) = db else {
        return Ok(());
    };
    let dir = std::path::absolute(directory_of(path)).map_err(|e| format!("{}: {e}", path.display()))?;
    if std::fs::symlink_metadata(&dir).is_err() {
        let make = |dir: &Path| -> Result<(), String> {
            use std::os::unix::fs::DirBuilderExt;
            // Its parents as any directory (0755 less the umask), itself 0750.
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent).map_err(|e| denied(parent, workers, e))?;
            }
            std::fs::DirBuilder::new()
                .mode(0o750)
                .create(dir)
                .map_err(|e| denied(dir, workers, e))
        };
        match workers {
            // Where the workers could change the path under root's feet (a directory on
            // the way that they may write), they make the directory themselves.
            Some(w) if !root_owns_the_way(&dir, w)? => as_identity(workers, || make(&dir))??,
            Some(w) => {
                make(&dir)?;
                // Made in a parent only root may change: it is the one given (and lchown
                // follows no link).
                std::os::unix::fs::lchown(&dir, Some(w.uid), Some(w.gid)).map_err(|e| {
                    format!(
                        "{}: cannot give it to the workers' user {}: {e}",
                        dir.display(),
                        w.user
                    )
                })?;
            }
            None => make(&dir)?,
        }
    }
    as_identity(workers, || create_and_seed(path, workers))?
}

/// Whether no directory on the way to `dir` (absolute) can be changed by the workers, so
/// that root may create it by name: each existing directory on the way that the workers
/// may write (the kernel's answer, as them) could have its next component replaced, by a
/// link for instance, unless it is sticky and that component exists and is not theirs
/// (as in `/tmp`).
fn root_owns_the_way(dir: &Path, w: &appsrv::WorkerIdentity) -> Result<bool, String> {
    use std::os::unix::fs::MetadataExt;
    let ancestors: Vec<&Path> = dir.ancestors().skip(1).collect();
    as_identity(Some(w), || {
        for parent in ancestors.iter().rev() {
            let Ok(meta) = std::fs::symlink_metadata(parent) else {
                // Missing from here down: made by root below a directory checked already.
                return true;
            };
            let writable = nix::unistd::faccessat(
                nix::fcntl::AT_FDCWD,
                *parent,
                nix::unistd::AccessFlags::W_OK,
                nix::fcntl::AtFlags::AT_EACCESS,
            )
            .is_ok();
            if !writable {
                continue;
            }
            let child = dir
                .strip_prefix(parent)
                .ok()
                .and_then(|rest| rest.components().next())
                .map(|c| parent.join(c));
            let child = child.and_then(|c| std::fs::symlink_metadata(c).ok());
            let sticky = meta.mode() & 0o1000 != 0;
            if !(sticky && child.is_some_and(|c| c.uid() != w.uid)) {
                return false;
            }
        }
        true
    })
}

/// What `check` can say without creating anything: that the workers could open or create
/// the database (a missing directory is the master's to make).
pub(crate) fn check(db: &Database, workers: Option<&appsrv::WorkerIdentity>) -> Result<(), String> {
    let Database::Sqlite(path) = db else {
        return Ok(());
    };
    let dir = directory_of(path);
    if std::fs::symlink_metadata(&dir).is_err() {
        return Ok(());
    }
    as_identity(workers, || {
        if regular_file(path)? {
            let flags = READ_WRITE;
            let conn =
                rusqlite::Connection::open_with_flags(path, flags).map_err(|e| denied(path, workers, e))?;
            conn.query_row("PRAGMA schema_version", [], |_| Ok(()))
                .map_err(|e| format!("{}: {e}", path.display()))
        } else {
            use nix::unistd::AccessFlags;
            nix::unistd::faccessat(
                nix::fcntl::AT_FDCWD,
                &dir,
                AccessFlags::W_OK | AccessFlags::X_OK,
                nix::fcntl::AtFlags::AT_EACCESS,
            )
            .map_err(|e| denied(&dir, workers, e))
        }
    })?
}

/// How the database is opened after the master made it: read-write, never created by
/// SQLite (the file is made with `O_EXCL` first, or must exist), no mutex (one thread).
const READ_WRITE: rusqlite::OpenFlags =
    rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE.union(rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX);

fn directory_of(path: &Path) -> PathBuf {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_owned()
}

/// Whether `path` is a regular file (`false`: there is none); a link or anything else is
/// refused.
fn regular_file(path: &Path) -> Result<bool, String> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(format!(
            "{}: a symbolic link: refused (give the file's own path)",
            path.display()
        )),
        Ok(m) if !m.is_file() => Err(format!("{}: not a regular file", path.display())),
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// An error met as the workers' user, with what it means for them.
fn denied(path: &Path, workers: Option<&appsrv::WorkerIdentity>, e: impl fmt::Display) -> String {
    match workers {
        Some(w) => format!(
            "{}: {e}: not writable by the workers' user {} (SQLite in WAL mode writes the \
             database and its -wal and -shm files beside it): give its directory to {}, or \
             pick another --database sqlite:PATH",
            path.display(),
            w.user,
            w.user
        ),
        None => format!("{}: {e}", path.display()),
    }
}

/// Creates the file (if missing), sets WAL mode and loads the seed data (if it has no
/// schema): run as the workers' user.
fn create_and_seed(path: &Path, workers: Option<&appsrv::WorkerIdentity>) -> Result<(), String> {
    if !regular_file(path)? {
        // O_CREAT | O_EXCL: fails on anything already there, a link included.
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o640)
            .open(path)
            .map_err(|e| denied(path, workers, e))?;
    }
    let flags = READ_WRITE;
    let mut conn =
        rusqlite::Connection::open_with_flags(path, flags).map_err(|e| denied(path, workers, e))?;
    let fail = |e: rusqlite::Error| denied(path, workers, e);
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
        .map_err(fail)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!(
            "{}: cannot use WAL mode (journal_mode is {mode})",
            path.display()
        ));
    }
    let has_schema: bool = conn
        .query_row(
            "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'item_tags'",
            [],
            |r| r.get(0),
        )
        .map_err(fail)?;
    if !has_schema {
        seed_sqlite(&mut conn).map_err(fail)?;
        tracing::info!(
            "{}: created, with {SEED_ITEMS} items of seed data",
            path.display()
        );
    }
    conn.close().map_err(|(_, e)| fail(e))
}

/// Runs `f` with the workers' effective user, group and groups (`None`: as this process),
/// then switches back. The master is single-threaded, and the switch is undone before it
/// binds or forks; a switch back that fails leaves a process that is neither, which cannot
/// go on: it aborts.
fn as_identity<T>(workers: Option<&appsrv::WorkerIdentity>, f: impl FnOnce() -> T) -> Result<T, String> {
    use nix::unistd::{Gid, Uid, getegid, geteuid, getgroups, setegid, seteuid, setgroups};
    let Some(w) = workers else {
        return Ok(f());
    };
    let (uid, gid) = (geteuid(), getegid());
    let groups = getgroups().map_err(|e| format!("getgroups: {e}"))?;
    let theirs: Vec<Gid> = w.groups.iter().copied().map(Gid::from_raw).collect();
    // Each step taken is undone, in reverse, whatever happens after it (a failed next
    // step, a panic in `f`); only a step that cannot be undone aborts.
    struct Undo(Vec<Box<dyn FnMut() -> nix::Result<()>>>);
    impl Drop for Undo {
        fn drop(&mut self) {
            while let Some(mut undo) = self.0.pop() {
                if let Err(e) = undo() {
                    eprintln!("frontpage: cannot switch back from the workers' identity: {e}");
                    std::process::abort();
                }
            }
        }
    }
    let mut undo = Undo(Vec::new());
    let fail = |e: nix::Error| format!("cannot act as the workers' user {}: {e}", w.user);
    setgroups(&theirs).map_err(fail)?;
    undo.0.push(Box::new(move || setgroups(&groups)));
    setegid(Gid::from_raw(w.gid)).map_err(fail)?;
    undo.0.push(Box::new(move || setegid(gid)));
    seteuid(Uid::from_raw(w.uid)).map_err(fail)?;
    undo.0.push(Box::new(move || seteuid(uid)));
    let out = f();
    drop(undo);
    Ok(out)
}

fn seed_sqlite(conn: &mut rusqlite::Connection) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    tx.execute_batch(SQLITE_SCHEMA)?;
    {
        let mut author = tx.prepare("INSERT INTO authors (id, name, email) VALUES ($1, $2, $3)")?;
        for (id, name, email) in seed_authors() {
            author.execute(rusqlite::params![id, name, email])?;
        }
        let mut tag = tx.prepare("INSERT INTO tags (id, name) VALUES ($1, $2)")?;
        for (i, name) in TAGS.iter().enumerate() {
            tag.execute(rusqlite::params![i as i64 + 1, name])?;
        }
        let mut item = tx.prepare(
            "INSERT INTO items (id, author_id, title, body, score, created) VALUES ($1, $2, $3, $4, $5, $6)",
        )?;
        let mut item_tag = tx.prepare(SQL_INSERT_TAG)?;
        for i in 1..=SEED_ITEMS {
            let (author_id, title, body, score, created) = seed_item(i);
            item.execute(rusqlite::params![i, author_id, title, body, score, created])?;
            for t in seed_item_tags(i) {
                item_tag.execute(rusqlite::params![i, t])?;
            }
        }
    }
    tx.commit()
}

// ---------------------------------------------------------------------------------------
// In each worker: what a request asks, and the blocking mode's connection.

/// What a request asks of the database: the handler has routed it and checked its input
/// (`frontpage.rs`), whichever mode runs it.
#[derive(Debug)]
pub(crate) enum Query {
    /// `/`: the front page's three queries.
    Front,
    /// `/rows?n=N`: the first N items.
    Rows(i64),
    /// `/item/ID`.
    Item(i64),
    /// `POST /item`.
    Insert(NewItem),
}

impl Query {
    /// Whether the query only reads, and so may run again on a new connection when its
    /// connection turns out to be gone. A write is never repeated: whether a lost write
    /// took effect cannot be known.
    pub(crate) fn reads(&self) -> bool {
        !matches!(self, Query::Insert(_))
    }
}

/// What a [`Query`] got.
#[derive(Debug)]
pub(crate) enum Answer {
    Front(Front),
    Rows(Table),
    /// `None`: no such item.
    Item(Option<Item>),
    /// The new item's id.
    Inserted(i64),
}

/// One worker's database in blocking mode: its connection and prepared statements.
pub(crate) enum Store {
    Sqlite(rusqlite::Connection),
    Postgres(Box<Pg>),
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Store::Sqlite(_) => "Store::Sqlite",
            Store::Postgres(_) => "Store::Postgres",
        })
    }
}

/// `--database` as tokio-postgres's configuration, with a connect timeout of 5 s unless the
/// URL sets one.
pub(crate) fn postgres_config(db: &Database, url: &str) -> Result<tokio_postgres::Config, String> {
    let mut config: tokio_postgres::Config = url.parse().map_err(|e| format!("{db}: {e}"))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    Ok(config)
}

/// Opens the worker's connection (in the handler factory: after the fork, the privilege
/// drop and the sandbox). SQLite: the file the master prepared, read-write, never created
/// here. PostgreSQL: connects, loads the schema and seed data if the database has none
/// (under an advisory lock, so that one worker does it), and prepares the statements; a
/// server that cannot be reached leaves the worker without a connection for now, any
/// other failure (authentication, no such database) stops the start with the reason.
pub(crate) fn open(db: &Database, busy_timeout: Duration) -> Result<Store, String> {
    match db {
        Database::Sqlite(path) => {
            let flags = READ_WRITE;
            let fail = |e: rusqlite::Error| format!("{}: {e}", path.display());
            let conn = rusqlite::Connection::open_with_flags(path, flags).map_err(fail)?;
            conn.busy_timeout(busy_timeout).map_err(fail)?;
            // With WAL, NORMAL syncs at checkpoints, not at each commit: a power loss may
            // lose the last commits, never corrupt the file (SQLite's advice for WAL).
            conn.pragma_update(None, "synchronous", "NORMAL").map_err(fail)?;
            conn.pragma_update(None, "foreign_keys", "ON").map_err(fail)?;
            conn.set_prepared_statement_cache_capacity(16);
            // Prepared now, so that a schema that does not match fails the start.
            for sql in [
                SQL_LATEST, SQL_COUNT, SQL_CLOUD, SQL_ITEM, SQL_ROWS_1, SQL_ROWS_6, SQL_ROWS_7,
            ] {
                conn.prepare_cached(sql).map_err(fail)?;
            }
            Ok(Store::Sqlite(conn))
        }
        Database::Postgres(url) => {
            let config = postgres_config(db, url)?;
            // Built here, in the worker (a runtime does not survive a fork): a current-thread
            // runtime starts no thread, and runs only while the worker blocks on it.
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .build()
                .map_err(|e| format!("{db}: the client's runtime: {e}"))?;
            let mut pg = Pg {
                name: db.to_string(),
                config,
                rt,
                conn: None,
                retry_at: None,
            };
            match pg.connect() {
                Ok(conn) => pg.conn = Some(conn),
                // A server that cannot be reached now may be restarting: a worker started
                // during an outage (a replacement, a reload) must not fail, or the pool
                // shrinks until nothing answers at all. It starts without a connection,
                // answers 503 and tries again; anything else stops the start.
                Err(e) if lost(&e) => {
                    tracing::warn!(
                        "{db}: cannot connect ({}); this worker starts without a connection, \
                         answers 503 and tries again at most once a second",
                        describe(&e)
                    );
                    pg.retry_at = Some(Instant::now() + Duration::from_secs(1));
                }
                Err(e) => return Err(format!("{db}: {}", describe(&e))),
            }
            Ok(Store::Postgres(Box::new(pg)))
        }
    }
}

impl Store {
    /// Runs `query`, blocking until the database answers. An insert the data refuses (an
    /// unknown author or tag) is [`Failure::Invalid`], and writes nothing.
    pub(crate) fn run(&mut self, query: &Query) -> Result<Answer, Failure> {
        match self {
            Store::Sqlite(c) => Ok(match query {
                Query::Front => Answer::Front(sqlite_front(c)?),
                Query::Rows(n) => Answer::Rows(sqlite_rows(c, *n)?),
                Query::Item(id) => Answer::Item(sqlite_item(c, *id)?),
                Query::Insert(new) => Answer::Inserted(sqlite_insert(c, new)?),
            }),
            // The queries are the async mode's (`PgConn::run`), blocked on.
            Store::Postgres(pg) => {
                let run = |rt: &tokio::runtime::Runtime, c: &mut PgConn| rt.block_on(c.run(query));
                let ran = if query.reads() { pg.read(run) } else { pg.with(run) };
                ran?.map_err(Failure::Invalid)
            }
        }
    }
}

/// The front page's three queries.
fn sqlite_front(c: &rusqlite::Connection) -> Result<Front, Failure> {
    let latest = {
        let mut s = c.prepare_cached(SQL_LATEST).map_err(lite)?;
        s.query_map([], |r| {
            Ok(Latest {
                id: r.get(0)?,
                title: r.get(1)?,
                author: r.get(2)?,
                created: r.get(3)?,
                score: r.get(4)?,
            })
        })
        .and_then(Iterator::collect)
        .map_err(lite)?
    };
    let count = c
        .prepare_cached(SQL_COUNT)
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(lite)?;
    let tags = c
        .prepare_cached(SQL_CLOUD)
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(lite)?;
    Ok(Front {
        latest,
        count,
        cloud: cloud(tags),
    })
}

/// The first `n` items, with the columns of [`columns`]`(n)`.
fn sqlite_rows(c: &rusqlite::Connection, n: i64) -> Result<Table, Failure> {
    let header = columns(n);
    let width = header.len();
    let mut s = c.prepare_cached(rows_sql(n)).map_err(lite)?;
    let rows = s
        .query_map([n], |r| {
            (0..width)
                .map(|i| {
                    Ok(match r.get_ref(i)? {
                        rusqlite::types::ValueRef::Integer(v) => v.to_string(),
                        v => v.as_str()?.to_owned(),
                    })
                })
                .collect()
        })
        .and_then(Iterator::collect)
        .map_err(lite)?;
    Ok(Table { header, rows })
}

/// Item `id`, or `None`.
fn sqlite_item(c: &rusqlite::Connection, id: i64) -> Result<Option<Item>, Failure> {
    let mut s = c.prepare_cached(SQL_ITEM).map_err(lite)?;
    let mut rows = s
        .query_map([id], |r| {
            Ok(Item {
                id: r.get(0)?,
                title: r.get(1)?,
                body: r.get(2)?,
                score: r.get(3)?,
                created: r.get(4)?,
                author: r.get(5)?,
                email: r.get(6)?,
            })
        })
        .map_err(lite)?;
    rows.next().transpose().map_err(lite)
}

/// Inserts an item and its tags in one transaction: either all of it is written, or
/// (an unknown author or tag, a failure) nothing. Returns the new item's id.
fn sqlite_insert(c: &mut rusqlite::Connection, new: &NewItem) -> Result<i64, Failure> {
    // IMMEDIATE takes the write lock at BEGIN, so that busy_timeout applies there; a
    // deferred transaction that reads, then writes, could fail with SQLITE_BUSY at once
    // when another writer came first.
    let tx = c
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(lite)?;
    let author: Option<i64> = tx
        .prepare_cached(SQL_AUTHOR)
        .and_then(|mut s| s.query_map([new.author_id], |r| r.get(0))?.next().transpose())
        .map_err(lite)?;
    if author.is_none() {
        return Err(Failure::Invalid(format!("unknown author_id {}", new.author_id)));
    }
    let mut tag_ids = Vec::new();
    for name in &new.tags {
        let id: Option<i64> = tx
            .prepare_cached(SQL_TAG)
            .and_then(|mut s| s.query_map([name], |r| r.get(0))?.next().transpose())
            .map_err(lite)?;
        tag_ids.push(id.ok_or_else(|| Failure::Invalid(format!("unknown tag {name:?}")))?);
    }
    let id: i64 = tx
        .prepare_cached(SQL_INSERT_ITEM)
        .and_then(|mut s| {
            s.query_row(
                rusqlite::params![new.author_id, new.title, new.body, new.created],
                |r| r.get(0),
            )
        })
        .map_err(lite)?;
    for t in tag_ids {
        tx.prepare_cached(SQL_INSERT_TAG)
            .and_then(|mut s| s.execute([id, t]))
            .map_err(lite)?;
    }
    tx.commit().map_err(lite)?;
    Ok(id)
}

/// A SQLite error as a failure: a database locked for longer than `busy_timeout` is
/// unavailable (503), anything else internal.
fn lite(e: rusqlite::Error) -> Failure {
    use rusqlite::ErrorCode::{DatabaseBusy, DatabaseLocked};
    match &e {
        rusqlite::Error::SqliteFailure(f, _) if matches!(f.code, DatabaseBusy | DatabaseLocked) => {
            Failure::Unavailable(format!("database busy: {e}"))
        }
        _ => Failure::Internal(e.to_string()),
    }
}

// ---------------------------------------------------------------------------------------
// PostgreSQL: a connection and its queries, for both modes.

/// `POST /item` on PostgreSQL in one statement, so one implicit transaction: the item and
/// its tags are written together, or (an unknown author or tag) nothing is. One statement
/// rather than `BEGIN … COMMIT` because a connection of the async mode is shared: the
/// queries of other requests pipelined on it between a `BEGIN` and its `COMMIT` would run
/// inside that transaction. The row says why nothing was written: the new id (NULL when
/// none), whether the author exists, and the first unknown tag in the order given (NULL
/// when none), which are the blocking SQLite insert's reasons, checked in its order. An
/// identity value is drawn only for a row inserted: a refusal leaves no gap in the ids.
const SQL_INSERT_PG: &str = "WITH author AS (SELECT id FROM authors WHERE id = $1), \
     wanted AS (SELECT w.name, w.ord, t.id FROM unnest($5::text[]) WITH ORDINALITY AS w (name, ord) \
         LEFT JOIN tags t ON t.name = w.name), \
     item AS (INSERT INTO items (author_id, title, body, score, created) \
         SELECT id, $2::text, $3::text, 0, $4::text FROM author \
         WHERE NOT EXISTS (SELECT 1 FROM wanted WHERE id IS NULL) RETURNING id), \
     tagged AS (INSERT INTO item_tags (item_id, tag_id) SELECT item.id, wanted.id FROM item, wanted) \
     SELECT (SELECT id FROM item), EXISTS (SELECT 1 FROM author), \
         (SELECT name FROM wanted WHERE id IS NULL ORDER BY ord LIMIT 1)";

/// A connection and its prepared statements: one per worker in blocking mode ([`Pg`]),
/// `--db-connections` per worker in async mode (`pool.rs`), the same queries in both.
pub(crate) struct PgConn {
    pub(crate) client: tokio_postgres::Client,
    latest: tokio_postgres::Statement,
    count: tokio_postgres::Statement,
    cloud: tokio_postgres::Statement,
    item: tokio_postgres::Statement,
    rows_1: tokio_postgres::Statement,
    rows_6: tokio_postgres::Statement,
    rows_7: tokio_postgres::Statement,
    insert: tokio_postgres::Statement,
    /// The connection's task, which ends when the connection does.
    task: tokio::task::JoinHandle<()>,
}

impl PgConn {
    /// Connects, runs the connection's task on the current runtime (`tokio::spawn`: the
    /// blocking mode's runtime, polled while the worker blocks on it, or the worker's own in
    /// async mode), loads the schema and seed data if the database has none, and prepares
    /// the statements.
    pub(crate) async fn open(
        config: &tokio_postgres::Config,
        name: &str,
    ) -> Result<PgConn, tokio_postgres::Error> {
        let (mut client, connection) = config.connect(tokio_postgres::NoTls).await?;
        // The connection's own task: it reads and writes the socket, and ends when the
        // connection does (the client then reports it closed).
        let name = name.to_owned();
        let task = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!("{name}: the connection ended: {}", describe(&e));
            }
        });
        load_postgres(&mut client).await?;
        PgConn::prepare(client, task).await
    }

    /// Ends the session in an orderly way: the client, dropped, asks its task to send the
    /// server a goodbye (`Terminate`), and the task ends once it is sent.
    async fn close(self) {
        drop(self.client);
        let _ = self.task.await;
    }

    /// Prepares every statement on `client`, pipelined: one round trip.
    async fn prepare(
        client: tokio_postgres::Client,
        task: tokio::task::JoinHandle<()>,
    ) -> Result<PgConn, tokio_postgres::Error> {
        let c = &client;
        let (latest, count, cloud, item, rows_1, rows_6, rows_7, insert) = tokio::try_join!(
            c.prepare(SQL_LATEST),
            c.prepare(SQL_COUNT),
            c.prepare(SQL_CLOUD),
            c.prepare(SQL_ITEM),
            c.prepare(SQL_ROWS_1),
            c.prepare(SQL_ROWS_6),
            c.prepare(SQL_ROWS_7),
            c.prepare(SQL_INSERT_PG),
        )?;
        Ok(PgConn {
            client,
            latest,
            count,
            cloud,
            item,
            rows_1,
            rows_6,
            rows_7,
            insert,
            task,
        })
    }

    /// Runs `query`; `Ok(Err(reason))` is an insert the data refuses (nothing written).
    pub(crate) async fn run(&self, query: &Query) -> Result<Result<Answer, String>, tokio_postgres::Error> {
        Ok(Ok(match query {
            Query::Front => Answer::Front(self.front().await?),
            Query::Rows(n) => Answer::Rows(self.rows(*n).await?),
            Query::Item(id) => Answer::Item(self.item(*id).await?),
            Query::Insert(new) => match self.insert(new).await? {
                Ok(id) => Answer::Inserted(id),
                Err(reason) => return Ok(Err(reason)),
            },
        }))
    }

    async fn front(&self) -> Result<Front, tokio_postgres::Error> {
        // The three queries go out together and their answers come back together: one
        // round trip to the server, not three (tokio-postgres pipelines the requests of
        // futures polled at the same time).
        let (latest, count, tags) = tokio::try_join!(
            self.client.query(&self.latest, &[]),
            self.client.query_one(&self.count, &[]),
            self.client.query(&self.cloud, &[])
        )?;
        let latest = latest
            .iter()
            .map(|r| Latest {
                id: r.get(0),
                title: r.get(1),
                author: r.get(2),
                created: r.get(3),
                score: r.get(4),
            })
            .collect();
        Ok(Front {
            latest,
            count: count.get(0),
            cloud: cloud(tags.iter().map(|r| (r.get(0), r.get(1))).collect()),
        })
    }

    async fn rows(&self, n: i64) -> Result<Table, tokio_postgres::Error> {
        let header = columns(n);
        let width = header.len();
        let stmt = match width {
            1 => &self.rows_1,
            6 => &self.rows_6,
            _ => &self.rows_7,
        };
        let rows = self
            .client
            .query(stmt, &[&n])
            .await?
            .iter()
            .map(|r| {
                (0..width)
                    .map(|i| match r.columns()[i].type_() {
                        &tokio_postgres::types::Type::INT8 => r.get::<_, i64>(i).to_string(),
                        _ => r.get::<_, String>(i),
                    })
                    .collect()
            })
            .collect();
        Ok(Table { header, rows })
    }

    async fn item(&self, id: i64) -> Result<Option<Item>, tokio_postgres::Error> {
        Ok(self.client.query_opt(&self.item, &[&id]).await?.map(|r| Item {
            id: r.get(0),
            title: r.get(1),
            body: r.get(2),
            score: r.get(3),
            created: r.get(4),
            author: r.get(5),
            email: r.get(6),
        }))
    }

    /// Inserts an item and its tags ([`SQL_INSERT_PG`]): the new id, or why nothing was
    /// written.
    async fn insert(&self, new: &NewItem) -> Result<Result<i64, String>, tokio_postgres::Error> {
        let row = self
            .client
            .query_one(
                &self.insert,
                &[&new.author_id, &new.title, &new.body, &new.created, &new.tags],
            )
            .await?;
        let (id, author, unknown_tag): (Option<i64>, bool, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        Ok(match (id, author, unknown_tag) {
            (Some(id), _, _) => Ok(id),
            (None, false, _) => Err(format!("unknown author_id {}", new.author_id)),
            (None, true, Some(name)) => Err(format!("unknown tag {name:?}")),
            // The statement inserts whenever the author and every tag exist.
            (None, true, None) => unreachable!("an insert with a known author and known tags wrote nothing"),
        })
    }
}

/// The blocking mode's PostgreSQL connection, one per worker, that comes back: dropped
/// when it fails, made again (with its statements) by the next request, at most once a
/// second while the server is down.
pub(crate) struct Pg {
    name: String,
    config: tokio_postgres::Config,
    /// The worker's runtime: it runs the connection's task and the queries while the
    /// worker blocks on them, and nothing otherwise.
    rt: tokio::runtime::Runtime,
    conn: Option<PgConn>,
    /// When the last connection attempt failed: the next one waits until then, and the
    /// requests in between get 503 at once rather than each wait for a connect timeout.
    retry_at: Option<Instant>,
}

impl Drop for Pg {
    /// Closes the connection in an orderly way (the runtime, dropped first, would drop the
    /// connection's task with its socket, and the server would see a lost client). Bounded:
    /// a server that does not read is not waited for.
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(1), conn.close()).await });
        }
    }
}

impl Pg {
    /// Connects, loads the schema and seed data if the database has none, and prepares
    /// the statements.
    fn connect(&self) -> Result<PgConn, tokio_postgres::Error> {
        self.rt.block_on(PgConn::open(&self.config, &self.name))
    }

    /// Runs `f` on the connection, connecting first if there is none. A failure that means
    /// the connection is gone (or cannot be made) drops it and is a 503.
    fn with<T>(
        &mut self,
        f: impl FnOnce(&tokio::runtime::Runtime, &mut PgConn) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, Failure> {
        if self.conn.is_none() {
            if self.retry_at.is_some_and(|t| Instant::now() < t) {
                return Err(Failure::Unavailable(format!("{}: not connected", self.name)));
            }
            match self.connect() {
                Ok(c) => {
                    tracing::info!("{}: connected again", self.name);
                    self.conn = Some(c);
                    self.retry_at = None;
                }
                Err(e) => {
                    self.retry_at = Some(Instant::now() + Duration::from_secs(1));
                    return Err(Failure::Unavailable(format!("{}: {}", self.name, describe(&e))));
                }
            }
        }
        let conn = self.conn.as_mut().expect("connected above");
        match f(&self.rt, conn) {
            Ok(v) => Ok(v),
            Err(e) if lost(&e) || conn.client.is_closed() => {
                tracing::warn!(
                    "{}: connection lost ({}); requests get 503 until it is made again",
                    self.name,
                    describe(&e)
                );
                self.conn = None;
                Err(Failure::Unavailable(format!("{}: {}", self.name, describe(&e))))
            }
            Err(e) => Err(Failure::Internal(describe(&e))),
        }
    }

    /// [`with`](Pg::with) for a read, which may safely run twice: when the connection
    /// turns out to be gone (the server ended an idle session, or restarted while this
    /// worker was idle) and a new one can be made at once, the read runs again on it, so
    /// the request gets its page rather than a 503. A write is never repeated: whether a
    /// lost COMMIT took effect cannot be known.
    fn read<T>(
        &mut self,
        mut f: impl FnMut(&tokio::runtime::Runtime, &mut PgConn) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, Failure> {
        let had_connection = self.conn.is_some();
        match self.with(&mut f) {
            Err(Failure::Unavailable(_)) if had_connection && self.conn.is_none() => {
                // The connection was found gone: one new attempt, now.
                self.retry_at = None;
                self.with(f)
            }
            other => other,
        }
    }
}

/// Whether a PostgreSQL error means the connection is gone: a closed connection or an
/// I/O error, SQLSTATE class 08 (connection exception), 57P01–57P03 (the server shuts
/// down or is starting), or 53300 (too many connections, for now). Other errors without a SQLSTATE are the client's own (a value of
/// the wrong type): a bug to report as such, not a reason to reconnect.
pub(crate) fn lost(e: &tokio_postgres::Error) -> bool {
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

/// An error with its cause (tokio-postgres's Display leaves the database's message
/// in the source).
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => match std::error::Error::source(e) {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        },
    }
}

/// Loads the schema and the seed data into a PostgreSQL database that has none: under a
/// session advisory lock, so that of the workers starting together one loads it and the
/// others, waiting on the lock, find it loaded. The check reads `pg_tables` in a fresh
/// statement after the lock is taken: a name lookup such as `to_regclass` may answer from
/// the backend's catalog cache, which has not yet seen the other worker's tables.
async fn load_postgres(client: &mut tokio_postgres::Client) -> Result<(), tokio_postgres::Error> {
    const LOADED: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables \
         WHERE schemaname = current_schema() AND tablename = 'item_tags')";
    if client.query_one(LOADED, &[]).await?.get::<_, bool>(0) {
        return Ok(());
    }
    // The key is arbitrary: this example's, for this one purpose.
    client.execute("SELECT pg_advisory_lock(202026)", &[]).await?;
    let loaded = load_locked(client, LOADED).await;
    let unlocked = client.execute("SELECT pg_advisory_unlock(202026)", &[]).await;
    loaded.and(unlocked.map(|_| ()))
}

async fn load_locked(client: &mut tokio_postgres::Client, loaded: &str) -> Result<(), tokio_postgres::Error> {
    if client.query_one(loaded, &[]).await?.get::<_, bool>(0) {
        return Ok(());
    }
    let tx = client.transaction().await?;
    tx.batch_execute(POSTGRES_SCHEMA).await?;
    let author = tx
        .prepare("INSERT INTO authors (id, name, email) VALUES ($1, $2, $3)")
        .await?;
    for (id, name, email) in seed_authors() {
        tx.execute(&author, &[&id, &name, &email]).await?;
    }
    let tag = tx.prepare("INSERT INTO tags (id, name) VALUES ($1, $2)").await?;
    for (i, name) in TAGS.iter().enumerate() {
        tx.execute(&tag, &[&(i as i64 + 1), name]).await?;
    }
    let item = tx
        .prepare(
            "INSERT INTO items (id, author_id, title, body, score, created) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .await?;
    let item_tag = tx.prepare(SQL_INSERT_TAG).await?;
    for i in 1..=SEED_ITEMS {
        let (author_id, title, body, score, created) = seed_item(i);
        tx.execute(&item, &[&i, &author_id, &title, &body, &score, &created])
            .await?;
        for t in seed_item_tags(i) {
            tx.execute(&item_tag, &[&i, &t]).await?;
        }
    }
    // The identity column continues after the seed's explicit ids.
    tx.execute(
        "SELECT setval(pg_get_serial_sequence('items', 'id'), (SELECT MAX(id) FROM items))",
        &[],
    )
    .await?;
    tx.commit().await?;
    tracing::info!("loaded the schema and {SEED_ITEMS} items of seed data");
    Ok(())
}
