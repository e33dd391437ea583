//! The async mode's PostgreSQL connections (issue 33): a small fixed set per worker,
//! `--db-connections` of them, each a tokio-postgres client with its statements prepared
//! once, on the worker's own runtime.
//!
//! A tokio-postgres client is used through `&`, and the queries of every future that uses
//! it at the same time go out on its one connection one after the other without waiting
//! for the answers (pipelining): a connection serves any number of requests in flight, so
//! nothing is checked out or returned, and no request waits for a free connection as it
//! would in a pool of exclusive connections (deadpool, bb8). The connections are handed to
//! the requests round-robin. Why more than one: PostgreSQL runs a session's queries one at
//! a time, in one backend process, so one connection keeps at most one of the server's
//! CPUs busy for the worker; two let the queries of one worker run on two CPUs while the
//! worker renders (see `--db-connections` in `frontpage.rs`).
//!
//! State: the handler is shared by every request in flight in the worker (`&self`), on one
//! thread, so each slot's connection is an `Rc` in a `RefCell` that is borrowed only to
//! clone or replace it, never across an `.await`; a request holds its own `Rc` while its
//! queries run, so a connection replaced meanwhile lives until they end.
//!
//! Reconnection, as the blocking mode's `Pg`: a connection found gone (a query failed with
//! a lost-connection error, or its task ended) is dropped from its slot, with one log
//! line, and made again by the next request that picks the slot, with its statements, at
//! most once a second while the server is down; requests meanwhile get 503. Of the requests
//! that find a slot empty at once, one connects and the others wait for it (the slot's
//! lock). A read whose connection turns out gone runs once more on a new connection (so
//! `pg_terminate_backend` costs a read nothing); a write is never repeated and gets 503. A
//! slot that waits out its second after a failed attempt is passed over for a connected
//! one, when there is one (a server at `max_connections` that refused only some).
//!
//! The connections are made by requests, not by the handler factory: the factory runs
//! before the worker's runtime exists (see `frontpage.rs`), and a connection belongs to the
//! runtime that drives its socket.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::db::{self, Answer, Failure, PgConn, Query};

/// One worker's connections.
pub(crate) struct Pool {
    /// `--database`, its password hidden: for the log.
    name: String,
    config: tokio_postgres::Config,
    slots: Box<[Slot]>,
    /// The slot the next request starts from.
    next: Cell<usize>,
}

/// One of the connections.
#[derive(Default)]
struct Slot {
    /// `None` before its first request, and after the connection was found gone.
    conn: RefCell<Option<Rc<PgConn>>>,
    /// Held by the request that makes the connection; the others that picked the slot
    /// meanwhile wait for it.
    connecting: tokio::sync::Mutex<()>,
    /// Set when an attempt failed: no new one before this instant.
    retry_at: Cell<Option<Instant>>,
    /// Whether a connection was ever made here: the next one is "again".
    made: Cell<bool>,
}

impl Slot {
    /// The connection, unless there is none or its task has ended.
    fn live(&self) -> Option<Rc<PgConn>> {
        self.conn
            .borrow()
            .as_ref()
            .filter(|c| !c.client.is_closed())
            .cloned()
    }

    /// Whether a request that picks this slot may be served by it: it is connected, or may
    /// try to connect now.
    fn usable(&self) -> bool {
        self.live().is_some() || self.retry_at.get().is_none_or(|t| Instant::now() >= t)
    }
}

impl Pool {
    /// `connections` empty slots for `--database`, a PostgreSQL URL.
    pub(crate) fn new(db: &db::Database, connections: usize) -> Result<Pool, String> {
        let db::Database::Postgres(url) = db else {
            return Err(format!("{db}: async mode is for PostgreSQL"));
        };
        Ok(Pool {
            name: db.to_string(),
            config: db::postgres_config(db, url)?,
            slots: (0..connections.max(1)).map(|_| Slot::default()).collect(),
            next: Cell::new(0),
        })
    }

    /// Runs `query` on the next connection, making it first if needed. An insert the data
    /// refuses is [`Failure::Invalid`]; a connection that cannot be made, or is lost under
    /// a write, is [`Failure::Unavailable`].
    pub(crate) async fn run(&self, query: &Query) -> Result<Answer, Failure> {
        let (number, slot) = self.pick();
        let conn = self.connection(number, slot).await?;
        let failure = match conn.run(query).await {
            Ok(ran) => return ran.map_err(Failure::Invalid),
            Err(e) => self.failure(number, slot, &conn, &e),
        };
        if !(query.reads() && matches!(failure, Failure::Unavailable(_))) {
            return Err(failure);
        }
        // The connection is gone: a read runs once more, on a new connection made now (or
        // by the request that got there first; a slot that had a connection has no failed
        // attempt to wait out, unless one of those requests just failed to connect).
        let conn = self.connection(number, slot).await?;
        match conn.run(query).await {
            Ok(ran) => ran.map_err(Failure::Invalid),
            Err(e) => Err(self.failure(number, slot, &conn, &e)),
        }
    }

    /// What a query's error on `conn` means: a lost connection, dropped from its slot, is
    /// a 503; anything else a 500.
    fn failure(&self, number: usize, slot: &Slot, conn: &Rc<PgConn>, e: &tokio_postgres::Error) -> Failure {
        let why = db::describe(e);
        if db::lost(e) || conn.client.is_closed() {
            self.lost(number, slot, conn, &why);
            Failure::Unavailable(format!("{}: {why}", self.name))
        } else {
            Failure::Internal(why)
        }
    }

    /// The next slot round-robin (and its number, from 1, for the log), or, when that one
    /// waits out its second after a failed attempt, the first connected one after it.
    fn pick(&self) -> (usize, &Slot) {
        let n = self.slots.len();
        let start = self.next.get() % n;
        self.next.set(start + 1);
        (0..n)
            .map(|i| (start + i) % n)
            .find(|&i| self.slots[i].usable())
            .map_or((start + 1, &self.slots[start]), |i| (i + 1, &self.slots[i]))
    }

    /// The slot's connection, made first if it has none (or a closed one).
    async fn connection(&self, number: usize, slot: &Slot) -> Result<Rc<PgConn>, Failure> {
        if let Some(c) = slot.live() {
            return Ok(c);
        }
        let _turn = slot.connecting.lock().await;
        // Made by the request that held the lock before this one?
        if let Some(c) = slot.live() {
            return Ok(c);
        }
        // A connection whose task ended between requests (the server closed the session).
        let closed = slot.conn.borrow_mut().take();
        if closed.is_some() {
            self.log_lost(number, "the server closed it");
        }
        if slot.retry_at.get().is_some_and(|t| Instant::now() < t) {
            return Err(Failure::Unavailable(format!("{}: not connected", self.name)));
        }
        match PgConn::open(&self.config, &self.name).await {
            Ok(c) => {
                if slot.made.replace(true) {
                    tracing::info!(
                        "{}: connected again (connection {number} of {})",
                        self.name,
                        self.slots.len()
                    );
                } else {
                    tracing::debug!(
                        "{}: connected (connection {number} of {})",
                        self.name,
                        self.slots.len()
                    );
                }
                let c = Rc::new(c);
                *slot.conn.borrow_mut() = Some(Rc::clone(&c));
                slot.retry_at.set(None);
                Ok(c)
            }
            Err(e) => {
                slot.retry_at.set(Some(Instant::now() + Duration::from_secs(1)));
                // Not a lost connection (a refused login, a dropped table): said once a
                // second per slot at most, as the attempts are.
                if !db::lost(&e) {
                    tracing::error!("{}: cannot connect: {}", self.name, db::describe(&e));
                }
                Err(Failure::Unavailable(format!(
                    "{}: {}",
                    self.name,
                    db::describe(&e)
                )))
            }
        }
    }

    /// Drops `conn` from its slot, unless another request replaced it already (the
    /// requests pipelined on a connection all fail with it: one says so).
    fn lost(&self, number: usize, slot: &Slot, conn: &Rc<PgConn>, why: &str) {
        let mut current = slot.conn.borrow_mut();
        if current.as_ref().is_some_and(|c| Rc::ptr_eq(c, conn)) {
            *current = None;
            drop(current);
            self.log_lost(number, why);
        }
    }

    fn log_lost(&self, number: usize, why: &str) {
        tracing::warn!(
            "{}: connection lost ({why}; connection {number} of {}); its requests get 503 until \
             it is made again",
            self.name,
            self.slots.len()
        );
    }
}
