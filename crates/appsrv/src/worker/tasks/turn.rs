//! The wrappers that time the polls: the whole run as the slot's turn ([`Turned`]) and
//! each connection's future against `--slow-request` ([`Watched`]).

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskCx, Poll};
use std::time::Instant;

use crate::scoreboard::Slot;

use super::worker::{Label, Worker};

pin_project_lite::pin_project! {
    /// The one future the runtime runs, timed as the slot's turns: the master's
    /// `--request-timeout` watch kills a worker whose thread is stuck in one poll, as it
    /// does an event loop whose turn does not end. The access log's lines go out after each
    /// run, before the runtime waits.
    pub(super) struct Turned<'w, 'a, F> {
        slot: &'static Slot,
        worker: &'w Worker<'a>,
        #[pin]
        inner: F,
    }
}

impl<'w, 'a, F> Turned<'w, 'a, F> {
    /// `inner`, each poll a turn on `slot`, after which `worker`'s counts are published
    /// and its access log flushed.
    pub(super) fn new(slot: &'static Slot, worker: &'w Worker<'a>, inner: F) -> Self {
        Turned { slot, worker, inner }
    }
}

impl<F: Future> Future for Turned<'_, '_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<F::Output> {
        let this = self.project();
        this.slot.turn_begin(crate::scoreboard::now_ns());
        let r = this.inner.poll(cx);
        // The slot's counts once per turn, as the event loop publishes them, not at each
        // change (a request changes them four times).
        this.worker.publish();
        this.worker.ledger.borrow_mut().flush();
        this.slot.turn_end();
        r
    }
}

pin_project_lite::pin_project! {
    /// A connection's future, each poll timed against `--slow-request`.
    pub(super) struct Watched<'w, 'a, F> {
        worker: &'w Worker<'a>,
        label: Rc<Label>,
        #[pin]
        inner: F,
    }
}

impl<'w, 'a, F> Watched<'w, 'a, F> {
    /// `inner`, the future serving the connection named by `label`, watched for `worker`.
    pub(super) fn new(worker: &'w Worker<'a>, label: Rc<Label>, inner: F) -> Self {
        Watched { worker, label, inner }
    }
}

impl<F: Future> Future for Watched<'_, '_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<F::Output> {
        let this = self.project();
        let limit = this.worker.slow.borrow().limit;
        let Some(limit) = limit else {
            return this.inner.poll(cx);
        };
        let started = Instant::now();
        let r = this.inner.poll(cx);
        let ended = Instant::now();
        let took = ended.saturating_duration_since(started);
        if took > limit {
            this.worker.slow_poll(this.label, took, ended);
        }
        r
    }
}
