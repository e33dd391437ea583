//! The seam between a worker's set-up and the loop that serves: one context that every
//! driver serves with, and the [`Driver`] interface that `worker::run` picks an
//! implementation of once, from the I/O model and the role ([`choose`]).
//!
//! Five drivers implement it:
//!
//! | driver                  | serves                                        | file          |
//! |-------------------------|-----------------------------------------------|---------------|
//! | [`Blocking`]            | one connection at a time (`--io blocking`)    | `blocking.rs` |
//! | [`Event`]               | all at once from epoll (`--io event`, datagrams) | `event.rs` |
//! | [`FrontDriver`]         | a hybrid front: gathers requests, hands them off | `hybrid.rs`, `front.rs` |
//! | [`HybridWorker`]        | the blocking loop plus connections handed over | `hybrid.rs`  |
//! | [`Tasks`]               | async handlers: a future per connection on a tokio runtime | `tasks/`   |
//!
//! Each prepares what it needs from the system before the worker says it is ready (its
//! acceptor, its epoll instance: a failure there is a start failure with its reason), then
//! serves the client/request level ([`Connections`]) until a stop. What they share (the
//! set-up, the [`Ledger`]) is here and in `ledger.rs`, once; the client/request level
//! names none of them. Adding an I/O model means one more implementation of [`Driver`] and
//! one arm in [`choose`].
//!
//! [`Blocking`]: super::blocking::Blocking
//! [`Event`]: super::event::Event
//! [`FrontDriver`]: super::hybrid::FrontDriver
//! [`HybridWorker`]: super::hybrid::HybridWorker
//! [`Tasks`]: super::tasks::Tasks

use std::os::fd::BorrowedFd;

use crate::handler::DatagramHandler;
use crate::net::listener::Listener;
use crate::net::tls::ForWorker;
use crate::scoreboard::{Board, Slot};

use super::admission::Rules;
use super::ledger::Ledger;
use super::serve::Connections;
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

    /// Serves the client/request level's connections with `shared` until a stop; returns
    /// the worker's exit status.
    fn serve<C: Connections>(self, shared: Shared<'a>, level: &mut C) -> i32;
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

/// The driver a worker runs, chosen once from the I/O model and the role.
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
    /// An async handler (`--io event`).
    Tasks,
}

/// Which driver serves: a front is one whatever else; an async handler runs the async
/// driver (the configuration refuses it with another model, and with datagram listeners,
/// before start); datagrams are served from an event loop only (the configuration check
/// refuses a blocking server that mixes them with stream listeners before start).
pub(crate) fn choose(model: Model, role: Role, datagram_listeners: bool, asynchronous: bool) -> Kind {
    match (role, model) {
        (Role::Front, _) => Kind::Front,
        (Role::Worker, _) if asynchronous => Kind::Tasks,
        (Role::Worker, Model::Event) => Kind::Event,
        (Role::Worker, _) if datagram_listeners => Kind::Event,
        (Role::Worker, Model::Hybrid) => Kind::HybridWorker,
        (Role::Worker, Model::Blocking) => Kind::Blocking,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one place a model and a role become a driver.
    #[test]
    fn issue_32_a_driver_is_chosen_from_the_model_and_the_role() {
        assert_eq!(
            choose(Model::Blocking, Role::Worker, false, false),
            Kind::Blocking
        );
        assert_eq!(choose(Model::Event, Role::Worker, false, false), Kind::Event);
        assert_eq!(choose(Model::Blocking, Role::Worker, true, false), Kind::Event);
        assert_eq!(
            choose(Model::Hybrid, Role::Worker, false, false),
            Kind::HybridWorker
        );
        assert_eq!(choose(Model::Hybrid, Role::Front, false, false), Kind::Front);
        assert_eq!(choose(Model::Hybrid, Role::Front, true, false), Kind::Front);
        assert_eq!(choose(Model::Event, Role::Worker, false, true), Kind::Tasks);
    }
}
