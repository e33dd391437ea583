//! Which driver serves which handler level (issue 43): the one place where a level meets
//! the drivers that can serve it, each pair a [`Serves`] implementation.
//!
//! | level                 | drivers                                              |
//! |-----------------------|------------------------------------------------------|
//! | [`ClientLevel`]       | the blocking loop (its handler owns its connection)  |
//! | [`RequestLevel`]      | blocking, event, hybrid front, hybrid worker: `--io` |
//! | [`AsyncRequestLevel`] | the async driver                                     |
//! | [`AsyncClientLevel`]  | the async driver                                     |
//!
//! The pairs the entry point fixes (`Server::run_async` and an async handler) cannot be
//! written wrongly: an async level knows one driver. The pairs the command line chooses
//! (`--io`) are refused by the configuration check before start; a level reports a
//! refused one as a start failure too, should a check be missing, and no driver has a
//! case for a level it cannot serve.

use crate::handler::{AsyncHandler, AsyncRequestHandler, Handler, RequestHandler};

use super::blocking::Blocking;
use super::driver::{Kind, choose};
use super::event::Event;
use super::hybrid::{FrontDriver, HybridWorker};
use super::serve::{AsyncClientLevel, AsyncRequestLevel, ClientLevel, Connections, RequestLevel};
use super::tasks::Tasks;
use super::{Model, ServedBy, Start};

#[cfg(doc)]
use super::driver::Serves;

impl<H: Handler> ServedBy for ClientLevel<H> {
    fn start(&mut self, start: Start<'_>) -> i32 {
        if start.datagram_listeners() {
            return start.refused("a handle_client server has no datagram handler loop: datagrams need Server::datagrams and a request-level or datagram-only server");
        }
        match start.model() {
            Model::Blocking => start.run::<Blocking<'_>, _>(self),
            _ => start.refused("handle_client servers run in blocking workers only (--io is not theirs)"),
        }
    }

    fn on_worker_exit(&mut self) {
        Connections::on_worker_exit(self);
    }
}

impl<H: RequestHandler> ServedBy for RequestLevel<H> {
    fn start(&mut self, start: Start<'_>) -> i32 {
        match choose(start.model(), start.role(), start.datagram_listeners()) {
            Ok(Kind::Blocking) => start.run::<Blocking<'_>, _>(self),
            Ok(Kind::Event) => start.run::<Event<'_>, _>(self),
            Ok(Kind::Front) => start.run::<FrontDriver<'_>, _>(self),
            Ok(Kind::HybridWorker) => start.run::<HybridWorker<'_>, _>(self),
            Err(reason) => start.refused(reason),
        }
    }

    fn on_worker_exit(&mut self) {
        Connections::on_worker_exit(self);
    }
}

impl<H: AsyncRequestHandler> ServedBy for AsyncRequestLevel<H> {
    fn start(&mut self, start: Start<'_>) -> i32 {
        start.run::<Tasks<'_>, _>(self)
    }

    /// The async driver calls the handler's `on_worker_exit` itself, in its runtime.
    fn on_worker_exit(&mut self) {}
}

impl<H: AsyncHandler> ServedBy for AsyncClientLevel<H> {
    fn start(&mut self, start: Start<'_>) -> i32 {
        start.run::<Tasks<'_>, _>(self)
    }

    /// As for [`AsyncRequestLevel`]: called by the driver, in its runtime.
    fn on_worker_exit(&mut self) {}
}
