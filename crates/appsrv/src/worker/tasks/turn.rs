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

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::time::Duration;

    use futures_util::FutureExt;

    use super::*;
    use crate::net::listener::Addr;
    use crate::worker::tasks::worker::Settings;

    /// Issue 43: each poll of the run is a turn on the slot, which the master's
    /// `--request-timeout` watch reads: begun while the poll runs, over once it returns
    /// (the runtime then waits), the counts published at its end.
    #[test]
    fn issue_43_each_poll_of_the_run_is_a_turn_on_the_slot() {
        let w = Worker::for_test(Settings::default(), 0);
        let mut polls = 0usize;
        let run = poll_fn(|_| {
            polls += 1;
            assert!(w.board.read(1).unwrap().current.is_some(), "in a turn");
            w.open.set(polls);
            if polls < 2 { Poll::Pending } else { Poll::Ready(7) }
        });
        let mut turned = std::pin::pin!(Turned::new(w.slot, &w, run));
        assert!(turned.as_mut().now_or_never().is_none());
        let view = w.board.read(1).unwrap();
        assert!(view.current.is_none(), "the turn ended with the poll");
        assert_eq!(view.event.unwrap().counts.open, 1, "published at the turn's end");
        assert_eq!(turned.now_or_never(), Some(7));
        assert_eq!(w.board.read(1).unwrap().event.unwrap().counts.open, 2);
    }

    /// Issue 43: a poll of a connection's future that holds the thread longer than
    /// `--slow-request` is counted on the slot (and logged once per episode); a quick one
    /// is not, nor any without the limit.
    #[test]
    fn issue_43_a_poll_longer_than_slow_request_is_counted() {
        // The handler's blocking call that the watch is for.
        let blocking = || {
            poll_fn(|_| {
                std::thread::sleep(Duration::from_millis(30));
                Poll::Ready(())
            })
        };
        let label = || Rc::new(Label::new(Addr::Unix(None)));
        let w = Worker::for_test(
            Settings {
                slow_request: Some(Duration::from_millis(10)),
                ..Settings::default()
            },
            0,
        );
        Watched::new(&w, label(), blocking()).now_or_never().unwrap();
        Watched::new(&w, label(), blocking()).now_or_never().unwrap();
        Watched::new(&w, label(), std::future::ready(()))
            .now_or_never()
            .unwrap();
        assert_eq!(w.board.read(1).unwrap().slow_calls, 2);

        let unwatched = Worker::for_test(Settings::default(), 0);
        Watched::new(&unwatched, label(), blocking())
            .now_or_never()
            .unwrap();
        assert_eq!(unwatched.board.read(1).unwrap().slow_calls, 0);
    }
}
