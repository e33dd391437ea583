//! The client level of the async driver ([`ClientsOf`]): the user's handler owns the
//! connection, as an [`AsyncClient`]; the driver bounds and records it.

use std::io;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tokio::io::unix::AsyncFd;

use crate::conn::async_client::AsyncClient;
use crate::conn::buffers::Buffers;
use crate::conn::step::{self};
use crate::conn::transport::Transport;
use crate::handler::AsyncHandler;
use crate::net::listener::Addr;

use super::bytes::{bounded, cut_for_deadline};
use super::run::Level;
use super::worker::{Label, Worker};
use crate::conn::async_transport::linger;
use crate::worker::access::Outcome;
use crate::worker::ledger::{log_connection_error, panic_message};
use crate::worker::life::{Ended, Life, Unit};

/// The client level's side: the user's handler, which owns each connection.
pub(super) struct ClientsOf<'h, H> {
    pub(super) handler: &'h H,
}

impl<H: AsyncHandler> Level for ClientsOf<'_, H> {
    fn refusal(&self) -> String {
        // A connection of the client level is read by its handler: the budget never
        // refuses it.
        String::new()
    }

    fn unit(&self) -> Unit {
        Unit::Connection
    }

    async fn serve(
        &self,
        w: &Worker<'_>,
        io: AsyncFd<Transport>,
        peer: &Addr,
        id: u64,
        bufs: Buffers,
        _label: &Label,
        mut life: Life,
    ) {
        life.opened(Instant::now());
        let (read_timeout, write_timeout) = w.io_timeouts;
        let mut client = AsyncClient::new(
            io,
            peer.clone(),
            id,
            read_timeout,
            write_timeout,
            w.limits.min_send_rate,
        );
        client.prepend(bufs.unconsumed());
        // The `--max-inflight` permit (a session counts as one request in flight) is
        // waited for under the request timeout too.
        let call = async {
            let _flight = w.in_flight().await;
            AssertUnwindSafe(self.handler.handle_client(&mut client))
                .catch_unwind()
                .await
        };
        let outcome = match w.request_timeout {
            Some(t) => tokio::time::timeout(t, call).await.ok(),
            None => Some(call.await),
        };
        let mut close_gently = false;
        // By the one rule (issue 42), as the blocking loop records a `handle_client`
        // connection.
        let ended = match outcome {
            Some(Ok(Ok(()))) => {
                let _ = bounded(Some(Duration::from_secs(1)), async {
                    use tokio::io::AsyncWriteExt;
                    client.flush().await
                })
                .await;
                close_gently = true;
                Ended::Clean
            }
            Some(Ok(Err(e))) => {
                log_connection_error(peer, &e);
                Ended::Failed(e.kind())
            }
            Some(Err(p)) => {
                tracing::error!(
                    "the handler panicked on the connection from {peer}: {}; closing it, the worker goes on",
                    panic_message(&*p)
                );
                Ended::Panicked
            }
            None => {
                w.cut_by_timeout(peer, "the connection");
                Ended::Cut
            }
        };
        let bytes = (client.received, client.sent);
        w.slot.add_bytes(bytes.0, bytes.1);
        let outcome = life.close(&mut w.ledger.borrow_mut(), peer, ended, bytes, Instant::now);
        w.ledger.borrow_mut().check_recycle();
        if outcome == Some(Outcome::Timeout) {
            // A write past its deadline, or the request timeout: what the kernel still
            // holds for the client is dropped with the socket.
            cut_for_deadline(client.io(), &io::Error::from(io::ErrorKind::TimedOut));
        }
        if close_gently {
            // The handler is done: its last reply goes out with the close, which lingers
            // (what the client still sends is read and dropped until its own close, 2 s
            // at most), so that unread input does not make the kernel reset the
            // connection under that reply.
            let mut io = client.into_io();
            Box::pin(linger(&mut io, step::LINGER)).await;
        }
    }

    fn on_worker_exit(&self) {
        self.handler.on_worker_exit();
    }

    async fn refuse(&self, _w: &Worker<'_>, _io: AsyncFd<Transport>, _why: &'static str) {
        // No codec to say why: closed at once.
    }
}
