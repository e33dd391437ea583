//! The wrappers that time the polls: the whole run as the slot's turn ([`Turned`]) and
//! each connection's future against `--slow-request` ([`Watched`]).

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskCx, Poll};
use std::time::Instant;

use crate::scoreboard::Slot;

use super::worker::{Label, Worker};

/// The one future the runtime runs, timed as the slot's turns: the master's
/// `--request-timeout` watch kills a worker whose thread is stuck in one poll, as it
/// does an event loop whose turn does not end. The access log's lines go out after each
/// run, before the runtime waits.
pub(super) struct Turned<'w, 'a, F> {
    pub(super) slot: &'static Slot,
    pub(super) worker: &'w Worker<'a>,
    pub(super) inner: F,
}

impl<F: Future> Future for Turned<'_, '_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<F::Output> {
        // SAFETY: `inner` is structurally pinned: it is never moved out of `self`, which
        // is pinned, and `Turned` has no `Drop` of its own.
        let this = unsafe { self.get_unchecked_mut() };
        this.slot.turn_begin(crate::scoreboard::now_ns());
        // SAFETY: as above.
        let inner = unsafe { Pin::new_unchecked(&mut this.inner) };
        let r = inner.poll(cx);
        // The slot's counts once per turn, as the event loop publishes them, not at each
        // change (a request changes them four times).
        this.worker.publish();
        this.worker.ledger.borrow_mut().flush();
        this.slot.turn_end();
        r
    }
}

/// A connection's future, each poll timed against `--slow-request`.
pub(super) struct Watched<'w, 'a, F> {
    pub(super) worker: &'w Worker<'a>,
    pub(super) label: Rc<Label>,
    pub(super) inner: F,
}

impl<F: Future> Future for Watched<'_, '_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<F::Output> {
        // SAFETY: `inner` is structurally pinned (never moved out of the pinned `self`;
        // `Watched` has no `Drop` of its own).
        let this = unsafe { self.get_unchecked_mut() };
        let limit = this.worker.slow.borrow().limit;
        let Some(limit) = limit else {
            // SAFETY: as above.
            return unsafe { Pin::new_unchecked(&mut this.inner) }.poll(cx);
        };
        let started = Instant::now();
        // SAFETY: as above.
        let r = unsafe { Pin::new_unchecked(&mut this.inner) }.poll(cx);
        let ended = Instant::now();
        let took = ended.saturating_duration_since(started);
        if took > limit {
            this.worker.slow_poll(&this.label, took, ended);
        }
        r
    }
}
