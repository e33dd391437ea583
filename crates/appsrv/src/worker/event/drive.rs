//! A connection's pass, as far as it goes without waiting: admission's reads and writes
//! around its I/O-free machine, reading (one read per pass into the worker-wide buffer,
//! the budget's room), the step, writing (the output in one write, TLS records) and
//! `sendfile`, the write deadline and `--min-send-rate`, the lingering close.

use std::io::Read;
use std::io::{self, IoSlice};
use std::os::unix::fs::FileExt;
use std::time::Duration;

use crate::codec::FileBody;
use crate::conn::buffers::{BUFFER_SIZE, Buffers};
use crate::conn::send_watch::{SEND_CHECK, SendWatch};
use crate::conn::step::{self, Gathered, Next, Wait};
use crate::handler::RequestHandler;
use crate::scoreboard::Slot;

use super::super::admission;
use super::super::budget::OVER_BUDGET_READ;
use super::super::ledger::log_connection_error;
use super::super::life::{self, Counted};
use super::super::serve::Context;
use super::completion::At;
use super::connection::{Connection, Pass, Pending, Then};
use super::{Completion, Loop};

/// Reads of one connection per pass at most, when each fills the buffer (a client that
/// sends without pause must not keep the loop to itself).
const READS_PER_PASS: usize = 4;

impl<'a, H: RequestHandler, C: Completion<'a>> Loop<'a, H, C> {
    /// The connection's pass: as far as it goes without waiting.
    pub(super) fn drive(&mut self, c: &mut Connection<'a, H>, bufs: &mut Buffers, handler: &mut H) -> Pass {
        let mut reads = 0;
        loop {
            let waits = match std::mem::replace(&mut c.pending, Pending::Done) {
                Pending::Admit => self.admit(c, bufs, handler),
                Pending::Output(then) => match self.flush(c, bufs) {
                    Ok(true) => self.output_sent(c, then),
                    Ok(false) => {
                        c.pending = Pending::Output(then);
                        self.write_deadline(c);
                        Some(Pass::Wait)
                    }
                    Err(e) => {
                        log_connection_error(&c.peer, &e);
                        c.failed = Some(e.kind());
                        Some(Pass::Closed)
                    }
                },
                Pending::File { body, offset, left } => match self.send_file(c, bufs, body, offset, left) {
                    Ok(None) => {
                        let next = self.advance(c, bufs, handler);
                        self.follow(c, next);
                        None
                    }
                    Ok(Some(pending)) => {
                        c.pending = pending;
                        self.write_deadline(c);
                        Some(Pass::Wait)
                    }
                    Err(e) => {
                        log_connection_error(&c.peer, &e);
                        c.failed = Some(e.kind());
                        Some(Pass::Closed)
                    }
                },
                Pending::Advance => {
                    let next = self.advance(c, bufs, handler);
                    self.follow(c, next);
                    None
                }
                Pending::TimedOut => {
                    let mut quiet = Quiet {
                        stopping: self.stopping,
                        slot: self.cfg.slot,
                    };
                    let next = c.step.timed_out(bufs, &mut quiet, &c.peer, self.reactor.now);
                    self.follow(c, Gathered::Step(next));
                    None
                }
                Pending::Read { wait } => self.read(c, bufs, handler, wait, &mut reads),
                Pending::Linger { discarded } => {
                    c.pending = Pending::Linger { discarded };
                    Some(if self.discard(c) { Pass::Closed } else { Pass::Wait })
                }
                Pending::Done => Some(Pass::Closed),
            };
            if let Some(pass) = waits {
                return pass;
            }
        }
    }

    /// The output went out: what the step asked for next (`None`: go on now).
    fn output_sent(&mut self, c: &mut Connection<'a, H>, then: Then) -> Option<Pass> {
        // The client took the response: the next one starts afresh.
        c.watch = None;
        c.step.output_sent(&mut Quiet {
            stopping: self.stopping,
            slot: self.cfg.slot,
        });
        match then {
            Then::Read { wait, timeout } => {
                c.timer.deadline = timeout.map(|t| self.reactor.now + t);
                c.pending = Pending::Read { wait };
                None
            }
            Then::Yield => {
                c.pending = Pending::Advance;
                Some(Pass::Ready)
            }
            Then::HandOff => Some(Pass::HandOff),
            Then::Close { linger } => {
                c.transport.close_notify();
                if c.transport.records_pending() && c.writable {
                    let _ = c.transport.write_records();
                }
                match linger {
                    Some(d) if c.transport.shutdown(std::net::Shutdown::Write).is_ok() => {
                        c.timer.deadline = Some(self.reactor.now + d);
                        c.pending = Pending::Linger { discarded: 0 };
                        if d.is_zero() {
                            // Only what has arrived: never wait.
                            self.discard(c);
                            return Some(Pass::Closed);
                        }
                        None
                    }
                    _ => Some(Pass::Closed),
                }
            }
        }
    }

    /// Waiting for input: one read when the socket may have some, then the step on what
    /// came (`None`: go on now).
    fn read(
        &mut self,
        c: &mut Connection<'a, H>,
        bufs: &mut Buffers,
        handler: &mut H,
        wait: Wait,
        reads: &mut usize,
    ) -> Option<Pass> {
        if !c.readable && !c.closed_by_peer && !c.transport.input_pending() {
            c.pending = Pending::Read { wait };
            return Some(Pass::Wait);
        }
        if *reads == READS_PER_PASS {
            c.pending = Pending::Read { wait };
            return Some(Pass::Ready);
        }
        *reads += 1;
        let mut max = c.step.max_request_size();
        // At the budget of buffered bytes, a buffer does not grow: a connection with
        // nothing buffered reads a request head's worth into the worker-wide buffer, one
        // that has private buffers reads into the room they have.
        let over = self.over_budget();
        let (pending, capacity) = (bufs.unconsumed().len(), bufs.input_capacity());
        let mut take = usize::MAX;
        if over {
            if self.memory.pass_shared {
                take = OVER_BUDGET_READ.saturating_sub(pending);
            } else {
                max = max.min(capacity);
            }
        }
        let room = bufs.room(max);
        let room = if room.len() > take {
            &mut room[..take]
        } else {
            room
        };
        let room_len = room.len();
        if over && room_len == 0 && pending < c.step.max_request_size() {
            return self.out_of_budget(c, bufs, wait, capacity);
        }
        match c.transport.read(room) {
            Ok(0) if room_len > 0 => {
                let next = c.step.peer_closed(bufs);
                if let Next::Fail(e) = &next {
                    tracing::debug!("connection from {} ended early: {e}", c.peer);
                    c.failed = Some(e.kind());
                    return Some(Pass::Closed);
                }
                self.follow(c, Gathered::Step(next));
                None
            }
            Ok(n) => {
                bufs.filled(n);
                c.received += n as u64;
                if n < room_len && !c.transport.is_tls() {
                    // A short read drained the socket: the next edge says when more comes.
                    c.readable = false;
                }
                let now = self.reactor.now;
                c.step.received(&mut || now);
                let next = self.advance(c, bufs, handler);
                self.follow(c, next);
                None
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                c.readable = false;
                c.pending = Pending::Read { wait };
                Some(Pass::Wait)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                c.pending = Pending::Read { wait };
                None
            }
            Err(e) => {
                log_connection_error(&c.peer, &e);
                c.failed = Some(e.kind());
                Some(Pass::Closed)
            }
        }
    }

    /// Reads and drops what the client still sends, in a lingering close: true when done
    /// (its close, an error, or enough bytes).
    fn discard(&mut self, c: &mut Connection<'a, H>) -> bool {
        let Pending::Linger { discarded } = &mut c.pending else {
            return true;
        };
        loop {
            match c.transport.discard(&mut self.memory.scratch, false) {
                Ok(0) => return true,
                Ok(n) => {
                    *discarded += n;
                    if *discarded >= step::LINGER_BYTES {
                        return true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    c.readable = false;
                    return false;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
    }

    /// Sets the write deadline of a connection whose output waits for the socket: the write
    /// timeout, or with `--min-send-rate` a check every second (the watch keeps the write
    /// timeout then, as it does for the blocking loop).
    fn write_deadline(&self, c: &mut Connection<'a, H>) {
        if self.cfg.limits.min_send_rate > 0 {
            // The first wait of this output starts the checks; later waits keep their
            // cadence (the deadline is the next check).
            if c.watch.is_none() {
                c.watch = Some(Box::new(SendWatch::new(
                    self.cfg.limits.min_send_rate,
                    self.cfg.limits.write_timeout,
                )));
                c.sent_at_check = c.sent;
                c.timer.deadline = Some(self.reactor.now + SEND_CHECK);
            }
        } else {
            c.timer.deadline = self.cfg.limits.write_timeout.map(|t| self.reactor.now + t);
        }
    }

    /// Turns the step's answer into the connection's next move.
    pub(super) fn follow(&mut self, c: &mut Connection<'a, H>, next: Gathered) {
        let next = match next {
            Gathered::Whole => {
                c.pending = Pending::Output(Then::HandOff);
                return;
            }
            Gathered::Step(next) => next,
        };
        c.pending = match next {
            Next::Read { wait, timeout, .. } => Pending::Output(Then::Read { wait, timeout }),
            Next::More => Pending::Output(Then::Yield),
            // Straight to the file, the head still in the output: a small file is copied
            // after it (one write for both), a large one follows it (MSG_MORE).
            Next::SendFile(body) => Pending::File {
                offset: body.range.start,
                left: body.range.end.saturating_sub(body.range.start),
                body,
            },
            Next::Close { linger } => Pending::Output(Then::Close { linger }),
            Next::Fail(e) => {
                log_connection_error(&c.peer, &e);
                c.failed = Some(e.kind());
                Pending::Output(Then::Close { linger: None })
            }
        };
    }

    /// One call of the step on what `c`'s buffers hold: what the loop's completion makes of
    /// it (an event worker: the handler's answers; a front: whether the request is whole).
    fn advance(&mut self, c: &mut Connection<'a, H>, bufs: &mut Buffers, handler: &mut H) -> Gathered {
        let at = At {
            ledger: &mut self.ledger,
            stopping: self.stopping,
            now: self.reactor.now,
            open: self.reactor.conns.len(),
        };
        self.completion.advance(at, c, bufs, handler)
    }

    /// Writes the pending output (and TLS records): `Ok(true)` when all of it went out,
    /// `Ok(false)` when the socket is full (the next edge resumes it).
    fn flush(&mut self, c: &mut Connection<'a, H>, bufs: &mut Buffers) -> io::Result<bool> {
        Self::write_out(c, bufs, false)
    }

    /// [`flush`](Loop::flush); with `more`, a file's first bytes follow at once
    /// (`MSG_MORE`: the kernel packs the head with them).
    fn write_out(c: &mut Connection<'a, H>, bufs: &mut Buffers, more: bool) -> io::Result<bool> {
        loop {
            if c.transport.records_pending() {
                if !c.writable {
                    return Ok(false);
                }
                match c.transport.write_records() {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        c.writable = false;
                        return Ok(false);
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
                continue;
            }
            let out = bufs.pending_output();
            if out.is_empty() {
                return Ok(true);
            }
            if !c.writable {
                return Ok(false);
            }
            let wanted = out.len();
            let (n, r) = if more {
                c.transport.write_more(out)
            } else {
                c.transport.write(&[IoSlice::new(out)])
            };
            bufs.output_written(n);
            // The response's bytes (under TLS, the plaintext rustls took).
            c.sent += n as u64;
            match r {
                Ok(()) if n == 0 && !c.transport.records_pending() => {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                Ok(()) => {
                    if n < wanted && !c.transport.is_tls() {
                        c.writable = false;
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    c.writable = false;
                    return Ok(false);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends a file range after the output: a range that fits in the output buffer is
    /// copied into it (one `pread`, one write with the head); a larger one is sent with
    /// `sendfile(2)` (copied through TLS), resumed on the next edge when the socket is
    /// full. `Ok(None)` when all of it went out.
    fn send_file(
        &mut self,
        c: &mut Connection<'a, H>,
        bufs: &mut Buffers,
        body: FileBody,
        mut offset: u64,
        mut left: u64,
    ) -> io::Result<Option<Pending>> {
        let small = usize::try_from(left).is_ok_and(|l| bufs.pending_output().len() + l <= BUFFER_SIZE);
        if small && offset == body.range.start {
            let out = bufs.output();
            let at = out.len();
            out.resize(at + left as usize, 0);
            if let Err(e) = body.file.read_exact_at(&mut out[at..], offset) {
                out.truncate(at);
                return Err(e);
            }
            return Ok(None);
        }
        loop {
            if !Self::write_out(c, bufs, left > 0)? {
                return Ok(Some(Pending::File { body, offset, left }));
            }
            if left == 0 {
                return Ok(None);
            }
            if c.transport.is_tls() {
                let chunk = left.min(BUFFER_SIZE as u64) as usize;
                let out = bufs.output();
                out.resize(chunk, 0);
                if let Err(e) = body.file.read_exact_at(out, offset) {
                    out.clear();
                    return Err(e);
                }
                offset += chunk as u64;
                left -= chunk as u64;
                continue;
            }
            if !c.writable {
                return Ok(Some(Pending::File { body, offset, left }));
            }
            let chunk = usize::try_from(left.min(1 << 30)).unwrap_or(1 << 30);
            let mut off = i64::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            match c.transport.send_file(&body.file, &mut off, chunk) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    offset += n as u64;
                    left -= n as u64;
                    c.sent += n as u64;
                    if n < chunk {
                        c.writable = false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    c.writable = false;
                    return Ok(Some(Pending::File { body, offset, left }));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Admission's reads and writes, until the machine decides (`None`) or must wait for
    /// the socket or its deadline (`Some(Pass::Wait)`).
    fn admission_io(&mut self, c: &mut Connection<'a, H>, bufs: &mut Buffers) -> Option<Pass> {
        let machine = c.admission.as_mut()?;
        loop {
            match machine.next() {
                admission::Next::Read { by } => {
                    c.timer.deadline = by;
                    if !c.readable && !c.closed_by_peer {
                        return Some(Pass::Wait);
                    }
                    let room = bufs.room(BUFFER_SIZE);
                    let room_len = room.len();
                    match c.transport.socket().read(room) {
                        Ok(0) => machine.closed(),
                        Ok(n) => {
                            bufs.filled(n);
                            c.received += n as u64;
                            if n < room_len {
                                c.readable = false;
                            }
                            let used = machine.received(bufs.unconsumed(), self.reactor.now);
                            bufs.consume(used);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            c.readable = false;
                            return Some(Pass::Wait);
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => machine.failed(&e),
                    }
                }
                admission::Next::Write { by } => {
                    c.timer.deadline = by;
                    if !c.writable {
                        return Some(Pass::Wait);
                    }
                    match c
                        .transport
                        .socket()
                        .send_with_flags(machine.pending(), libc::MSG_NOSIGNAL)
                    {
                        Ok(0) => machine.failed(&io::ErrorKind::WriteZero.into()),
                        Ok(n) => {
                            c.sent += n as u64;
                            machine.sent(n, self.reactor.now);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            c.writable = false;
                            return Some(Pass::Wait);
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => machine.failed(&e),
                    }
                }
                admission::Next::Serve | admission::Next::Close => break,
            }
        }
        None
    }

    /// Runs admission as far as it goes: `None` when the connection is admitted (its
    /// pending state set to serve), `Some` when it waits or closed.
    fn admit(&mut self, c: &mut Connection<'a, H>, bufs: &mut Buffers, handler: &mut H) -> Option<Pass> {
        if c.admission.is_none() {
            c.pending = Pending::Read { wait: Wait::Idle };
            return None;
        }
        if let Some(waits) = self.admission_io(c, bufs) {
            c.pending = Pending::Admit;
            return Some(waits);
        }
        let machine = c.admission.take().expect("present");
        let counted = (machine.seat().counted)
            .zip(self.cfg.peers)
            .map(|(ip, peers)| Counted::new(peers, self.cfg.id, ip));
        let verdict = machine.finish();
        let (peer, then) = c
            .life
            .admitted(verdict, counted, &mut c.transport, &mut self.ledger);
        c.peer = peer;
        match then {
            life::Then::Serve => {}
            life::Then::Refuse(refusal) => {
                c.step.refuse(bufs, refusal);
                bufs.discard_input();
                c.pending = Pending::Output(Then::Close {
                    linger: Some(Duration::ZERO),
                });
                return None;
            }
            life::Then::Close => return Some(Pass::Closed),
        }
        if bufs.has_input() || c.transport.input_pending() {
            let next = self.advance(c, bufs, handler);
            self.follow(c, next);
        } else {
            let first = c.step.first_read();
            self.follow(c, Gathered::Step(first));
        }
        None
    }
}

/// The step's context outside a handler call (the output went out, a deadline passed, a
/// front gathering a request): the refusals it reports count on the slot (issue 41).
pub(super) struct Quiet<'s> {
    pub(super) stopping: bool,
    pub(super) slot: &'s Slot,
}

impl Context for Quiet<'_> {
    fn stopping(&mut self) -> bool {
        self.stopping
    }
    fn refused(&mut self, _: &crate::codec::ProtocolError) {
        self.slot.error();
    }
}
