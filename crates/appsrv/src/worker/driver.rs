//! The seam between a worker's set-up and the loop that serves: one context that every
//! driver serves with ([`Shared`]), the [`Driver`] interface (what it prepares before
//! `Ready`), and [`Serves`], implemented for each pair of a driver and a handler level that
//! exists (`pairing.rs` picks one per level, from the I/O model and the role: [`choose`]).
//!
//! Five drivers implement it:
//!
//! | driver                  | serves                                        | file          |
//! |-------------------------|-----------------------------------------------|---------------|
//! | `Blocking`            | one connection at a time (`--io blocking`)    | `blocking.rs` |
//! | `Event`               | all at once from epoll (`--io event`, datagrams) | `event/` |
//! | `FrontDriver`         | a hybrid front: gathers requests, hands them off | `hybrid.rs`, `front.rs` |
//! | `HybridWorker`        | the blocking loop plus connections handed over | `hybrid.rs`  |
//! | `Tasks`               | async handlers: a future per connection on a tokio runtime (`--io async`) | `tasks/`   |
//!
//! Each prepares what it needs from the system before the worker says it is ready (its
//! acceptor, its epoll instance: a failure there is a start failure with its reason), then
//! serves its level until a stop. What they share is here, in `ledger.rs` (the accounts)
//! and in `life.rs` (one connection's life: the admission's verdict applied, the request
//! clock, the close with the outcome rule); the levels name none of them. Adding an I/O
//! model means its file (a [`Driver`], its [`Serves`] pairs) and its arms in
//! `pairing.rs`: the unit tests' `one.rs` is such a driver.
//!
//! (The drivers are named here in plain text: this file is below them, `pairing.rs`
//! links them.)

use std::os::fd::BorrowedFd;

use crate::handler::DatagramHandler;
use crate::net::listener::Listener;
use crate::net::tls::ForWorker;
use crate::scoreboard::{Board, Slot};

use super::admission::Rules;
use super::ledger::Ledger;
use super::{ConnLimits, Model, Role, Setup};

/// What every driver serves with, whatever its model: the worker's set-up up to `Ready`,
/// apart from each driver's own settings (which it takes from [`Setup`] in
/// [`Driver::prepare`]).
pub(crate) struct Shared<'a> {
    /// The worker's number (its scoreboard slot's index).
    pub(crate) id: u32,
    pub(crate) board: &'static Board,
    pub(crate) slot: &'static Slot,
    /// Every listener of the server (a driver accepts on those it prepared for).
    pub(crate) listeners: &'a [Listener],
    /// The TLS listeners' configurations, and the handshake's time limit.
    pub(crate) tls: &'a ForWorker,
    /// Deadlines and budgets outside the request step.
    pub(crate) limits: ConnLimits,
    /// `--max-conns-per-ip`.
    pub(crate) max_per_ip: Option<usize>,
    /// The accounts: requests, connections, rejections, the recycling limit.
    pub(crate) ledger: Ledger<'a>,
}

impl std::fmt::Debug for Shared<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("id", &self.id)
            .field("limits", &self.limits)
            .field("ledger", &self.ledger)
            .finish_non_exhaustive()
    }
}

/// What the worker's set-up made that only some drivers use.
pub(crate) struct Extras<'a> {
    /// Hybrid mode: this side's end of the hand-off channel.
    pub(crate) handoff: Option<BorrowedFd<'a>>,
    /// The datagram handler, when the server has datagram listeners.
    pub(crate) datagrams: Option<Box<dyn DatagramHandler>>,
}

/// A way of serving connections: one per I/O model and role.
pub(crate) trait Driver<'a>: Sized {
    /// What the driver needs from the system before the worker says it is ready (its
    /// acceptor, its epoll instance), from the set-up and what the set-up made: `Err` with
    /// the reason is a start failure.
    fn prepare(setup: &Setup<'a>, slot: &'static Slot, extras: Extras<'a>) -> Result<Self, String>;
}

/// A driver that serves the handler level `L` (issue 43): implemented for the pairs that
/// exist only (the blocking loops for the sync levels, the event loop and the hybrid
/// front for the sync request level, the async driver for the async levels), so that no
/// driver has a case for a level it cannot serve.
pub(crate) trait Serves<'a, L>: Driver<'a> {
    /// Serves the level's connections with `shared` until a stop; returns the worker's
    /// exit status.
    fn serve(self, shared: Shared<'a>, level: &mut L) -> i32;
}

/// Whether this process accepts on listener `i`: a hybrid front leaves the TLS ones to the
/// workers (a TLS session cannot be handed over), which accept nothing else.
pub(crate) fn accepts_on(setup: &Setup<'_>, i: usize) -> bool {
    match (setup.io, setup.role) {
        (Model::Hybrid, Role::Front) => setup.tls.acceptor(i).is_none(),
        (Model::Hybrid, Role::Worker) => setup.tls.acceptor(i).is_some(),
        _ => true,
    }
}

/// The admission rules of a connection accepted on listener `index`: its access rules and
/// PROXY settings, its TLS, the deadlines, the per-address cap and the penalty table, the
/// same in every driver.
pub(crate) fn rules<'r>(
    listeners: &'r [Listener],
    tls: &'r ForWorker,
    limits: &ConnLimits,
    max_per_ip: Option<usize>,
    index: usize,
) -> Rules<'r> {
    Rules {
        policy: listeners[index].policy(),
        tls: tls.acceptor(index),
        header_timeout: limits.header_timeout,
        handshake_timeout: tls.handshake_timeout,
        max_per_ip,
        penalties: crate::penalty::installed(),
    }
}

/// The driver of a server at the sync request level, chosen once from the I/O model and
/// the role (the other levels have one driver each: `pairing.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `--io blocking`.
    Blocking,
    /// `--io event`, or any server with datagram listeners (served from an event loop).
    Event,
    /// `--io hybrid`, a front.
    Front,
    /// `--io hybrid`, a worker.
    HybridWorker,
}

/// Which driver serves the sync request level: a front is one whatever else; datagrams
/// are served from an event loop only (the configuration check refuses a blocking server
/// that mixes them with stream listeners before start). `--io async` is the async
/// handlers' model: the configuration check refuses it for this level before start.
pub(crate) fn choose(model: Model, role: Role, datagram_listeners: bool) -> Result<Kind, &'static str> {
    Ok(match (role, model) {
        (Role::Front, _) => Kind::Front,
        (Role::Worker, Model::Async) => return Err("--io async serves async handlers only"),
        (Role::Worker, Model::Event) => Kind::Event,
        (Role::Worker, _) if datagram_listeners => Kind::Event,
        (Role::Worker, Model::Hybrid) => Kind::HybridWorker,
        (Role::Worker, Model::Blocking) => Kind::Blocking,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one place a model and a role become a driver.
    #[test]
    fn issue_32_a_driver_is_chosen_from_the_model_and_the_role() {
        assert_eq!(choose(Model::Blocking, Role::Worker, false), Ok(Kind::Blocking));
        assert_eq!(choose(Model::Event, Role::Worker, false), Ok(Kind::Event));
        assert_eq!(choose(Model::Blocking, Role::Worker, true), Ok(Kind::Event));
        assert_eq!(choose(Model::Hybrid, Role::Worker, false), Ok(Kind::HybridWorker));
        assert_eq!(choose(Model::Hybrid, Role::Front, false), Ok(Kind::Front));
        assert_eq!(choose(Model::Hybrid, Role::Front, true), Ok(Kind::Front));
        assert!(choose(Model::Async, Role::Worker, false).is_err());
    }
}
