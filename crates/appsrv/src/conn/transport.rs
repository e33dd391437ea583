//! A connection's transport: the socket, plain or under TLS, with one system call (or none)
//! per operation, and "would block" as a normal answer.
//!
//! Nothing here waits on purpose, keeps a clock or retries: an operation that the socket
//! cannot do now returns [`io::ErrorKind::WouldBlock`] (on a socket with `O_NONBLOCK`; on a
//! blocking socket the same error means that its `SO_RCVTIMEO`/`SO_SNDTIMEO` expired), and
//! [`io::ErrorKind::Interrupted`] comes back as it is. The driver decides what to do with
//! them: the blocking client loops, turns an expired timeout into `TimedOut` and applies
//! `--min-send-rate` (`client.rs`, which uses this file, says how); an event loop waits for
//! readiness.
//!
//! Under TLS, plaintext that rustls has taken is never offered again: [`write`] reports
//! how much it took even when writing the records failed, and the records wait inside
//! rustls until [`write_records`] sends them.
//!
//! [`write`]: Transport::write
//! [`write_records`]: Transport::write_records

use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::AsRawFd;

use socket2::Socket;

use crate::net::tls::TlsSession;

/// The socket of one connection, and its TLS session once the handshake is done.
#[derive(Debug)]
pub(crate) struct Transport {
    socket: Socket,
    /// The TLS session, on a TLS listener (after the handshake).
    tls: Option<Box<TlsSession>>,
}

impl AsRawFd for Transport {
    /// The socket's descriptor (for an async worker's reactor to watch it).
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.socket.as_raw_fd()
    }
}

impl Transport {
    /// A plain transport over `socket`.
    pub(crate) fn new(socket: Socket) -> Self {
        Transport { socket, tls: None }
    }

    /// From now on, reads and writes go through `session` (its handshake is done).
    pub(crate) fn set_tls(&mut self, session: Box<TlsSession>) {
        self.tls = Some(session);
    }

    /// The socket (encrypted bytes under TLS), for its options and to wait on it.
    pub(crate) fn socket(&self) -> &Socket {
        &self.socket
    }

    /// The TLS session, under TLS.
    pub(crate) fn tls(&self) -> Option<&TlsSession> {
        self.tls.as_deref()
    }

    /// Whether the connection is under TLS.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Reads plaintext into `buf`: `Ok(0)` at the end of the stream (under TLS, a
    /// `close_notify` or the end of the TCP stream without one: a protocol that must detect
    /// truncation frames its messages).
    ///
    /// Plain: one `recv`. TLS: decrypted bytes rustls holds already, or else `read_tls` from
    /// the socket (one call when a whole record arrives, as usual; more only while the
    /// bytes received end in the middle of a record, until the socket has nothing more) and
    /// decryption. A TLS protocol error is `InvalidData`; the alert rustls prepared for the
    /// peer then waits in [`records_pending`](Transport::records_pending).
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(t) = self.tls.as_mut() else {
            return (&self.socket).read(buf);
        };
        loop {
            match t.conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            // Ok(0), the end of the stream, is reported by the reader above. Each pass gets
            // bytes from the socket, so this ends: with a record, the end, or WouldBlock.
            t.conn.read_tls(&mut &self.socket)?;
            t.conn
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}")))?;
        }
    }

    /// Whether decrypted input waits inside the TLS layer (so the socket need not be
    /// readable for the next read to return data). Always false on a plain connection.
    pub(crate) fn input_pending(&mut self) -> bool {
        self.tls.as_mut().is_some_and(|t| {
            t.conn
                .process_new_packets()
                .is_ok_and(|state| state.plaintext_bytes_to_read() > 0)
        })
    }

    /// Writes plaintext `data` (its slices in order). Returns how many bytes were *taken*,
    /// with how the write to the socket ended: taken bytes are gone, even with an error,
    /// and must never be offered again.
    ///
    /// Plain: one `send` (one slice) or `writev` (several); taken means written, and an
    /// error takes nothing. TLS: rustls encrypts as much as its buffer limit allows into
    /// records, then the records are written once ([`write_records`]); an error (or
    /// `WouldBlock`) there leaves the records pending, and the taken count stands.
    ///
    /// [`write_records`]: Transport::write_records
    pub(crate) fn write(&mut self, data: &[IoSlice<'_>]) -> (usize, io::Result<()>) {
        let Some(t) = self.tls.as_mut() else {
            let written = match data {
                [one] => (&self.socket).write(one),
                _ => (&self.socket).write_vectored(data),
            };
            return match written {
                Ok(n) => (n, Ok(())),
                Err(e) => (0, Err(e)),
            };
        };
        let taken = match t.conn.writer().write_vectored(data) {
            Ok(n) => n,
            Err(e) => return (0, Err(e)),
        };
        (taken, self.write_records().map(|_| ()))
    }

    /// Writes plaintext `data` telling the kernel that more follows at once (`MSG_MORE`,
    /// so that it packs `data` with the next send, a file's first bytes): one `send`.
    /// TLS has no such hint: there it is [`write`](Transport::write) (taken bytes, and the
    /// records' outcome).
    pub(crate) fn write_more(&mut self, data: &[u8]) -> (usize, io::Result<()>) {
        if self.tls.is_some() {
            return self.write(&[IoSlice::new(data)]);
        }
        match self.socket.send_with_flags(data, libc::MSG_MORE) {
            Ok(n) => (n, Ok(())),
            Err(e) => (0, Err(e)),
        }
    }

    /// Whether TLS records wait to be written (always false on a plain connection).
    pub(crate) fn records_pending(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.conn.wants_write())
    }

    /// Writes pending TLS records: one `writev` of what rustls holds. Returns the number of
    /// encrypted bytes written (0 when none were pending: see
    /// [`records_pending`](Transport::records_pending)).
    pub(crate) fn write_records(&mut self) -> io::Result<usize> {
        match self.tls.as_mut() {
            Some(t) if t.conn.wants_write() => t.conn.write_tls(&mut &self.socket),
            _ => Ok(0),
        }
    }

    /// Sends `len` bytes of `file` from `offset` (moved past what was sent) with one
    /// `sendfile(2)`; `Ok(0)` when the file ends before. Under TLS it is `Unsupported`: the
    /// kernel would bypass the encryption, so the driver copies the file through
    /// [`write`](Transport::write).
    pub(crate) fn send_file(&mut self, file: &File, offset: &mut i64, len: usize) -> io::Result<usize> {
        if self.tls.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "sendfile(2) would bypass TLS: copy the file instead",
            ));
        }
        nix::sys::sendfile::sendfile64(&self.socket, file, Some(offset), len).map_err(io::Error::from)
    }

    /// Queues TLS's `close_notify` (nothing on a plain connection); it goes out with the
    /// pending records ([`write_records`](Transport::write_records)).
    pub(crate) fn close_notify(&mut self) {
        if let Some(t) = self.tls.as_mut() {
            t.conn.send_close_notify();
        }
    }

    /// Shuts the socket down in direction `how`.
    pub(crate) fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        self.socket.shutdown(how)
    }

    /// Reads and drops raw bytes from the socket (encrypted ones too: nothing more is
    /// decrypted), for a lingering close: one `recv`, which never waits when `wait` is
    /// false (`MSG_DONTWAIT`).
    pub(crate) fn discard(&self, scratch: &mut [u8], wait: bool) -> io::Result<usize> {
        if wait {
            return (&self.socket).read(scratch);
        }
        nix::sys::socket::recv(
            self.socket.as_raw_fd(),
            scratch,
            nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        )
        .map_err(io::Error::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
    use std::os::unix::net::UnixStream;

    use crate::net::tls::testing::configs as tls_configs;

    /// A socket pair, both ends non-blocking, ours with a small send buffer (so that
    /// filling it is quick).
    fn pair() -> (Socket, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        theirs.set_nonblocking(true).unwrap();
        let socket = Socket::from(std::os::fd::OwnedFd::from(ours));
        socket.set_send_buffer_size(4096).unwrap();
        (socket, theirs)
    }

    fn would_block<T: std::fmt::Debug>(r: io::Result<T>) -> bool {
        matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Everything the peer can read now, without waiting.
    fn drain(peer: &mut UnixStream) -> Vec<u8> {
        let mut all = Vec::new();
        let mut chunk = [0u8; 65536];
        loop {
            match peer.read(&mut chunk) {
                Ok(0) => return all,
                Ok(n) => all.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return all,
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// A TLS transport over a non-blocking socket pair, its handshake done in this thread
    /// with a rustls client on the other end: nothing waits.
    fn tls_pair() -> (Transport, rustls::ClientConnection, UnixStream) {
        let (server, client) = tls_configs();
        let (socket, mut peer) = pair();
        let mut session = Box::new(TlsSession::new(server).unwrap());
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut client = rustls::ClientConnection::new(client, name).unwrap();
        for _ in 0..100 {
            if !client.is_handshaking() && !session.conn.is_handshaking() && !session.conn.wants_write() {
                break;
            }
            while client.wants_write() {
                client.write_tls(&mut peer).unwrap();
            }
            match session.conn.read_tls(&mut &socket) {
                Ok(_) => {
                    session.conn.process_new_packets().unwrap();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
            while session.conn.wants_write() {
                session.conn.write_tls(&mut &socket).unwrap();
            }
            match client.read_tls(&mut peer) {
                Ok(_) => {
                    client.process_new_packets().unwrap();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert!(!client.is_handshaking() && !session.conn.is_handshaking());
        session.established();
        let mut transport = Transport::new(socket);
        transport.set_tls(session);
        (transport, client, peer)
    }

    /// The plaintext the client can decrypt now from what reached its socket.
    fn client_reads(client: &mut rustls::ClientConnection, peer: &mut UnixStream) -> Vec<u8> {
        let mut plain = Vec::new();
        loop {
            match client.read_tls(peer) {
                Ok(0) => break,
                Ok(_) => {
                    client.process_new_packets().unwrap();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
            let _ = client.reader().read_to_end(&mut plain);
        }
        let _ = client.reader().read_to_end(&mut plain);
        plain
    }

    #[test]
    fn plain_would_block_is_an_answer_and_partial_writes_say_how_much() {
        let (socket, mut peer) = pair();
        let mut t = Transport::new(socket);
        let mut buf = [0u8; 64];
        assert!(would_block(t.read(&mut buf)), "nothing to read: WouldBlock");
        peer.write_all(b"hello").unwrap();
        assert_eq!(t.read(&mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"hello");

        // Fill the socket: the last write that takes anything takes part of its data, the
        // next one takes nothing and says WouldBlock.
        let big = vec![7u8; 100_000];
        let mut written = 0;
        let mut partial = false;
        loop {
            let (n, r) = t.write(&[IoSlice::new(b"head"), IoSlice::new(&big)]);
            written += n;
            if r.is_err() {
                assert!(would_block(r), "a full socket: WouldBlock");
                assert_eq!(n, 0, "an error takes nothing on a plain socket");
                break;
            }
            partial |= n < big.len() + 4;
            assert!(written < 100_000_000, "the socket never filled");
        }
        assert!(partial, "the kernel took part of a write, and it was reported");
        assert!(would_block(t.write_more(b"x").1));
        assert_eq!(
            drain(&mut peer).len(),
            written,
            "every byte reported was sent once"
        );

        peer.write_all(b"bye").unwrap();
        drop(peer);
        assert_eq!(t.read(&mut buf).unwrap(), 3);
        assert_eq!(t.read(&mut buf).unwrap(), 0, "the end of the stream");
        assert!(!t.records_pending() && !t.input_pending());
    }

    #[test]
    fn plain_send_file_sends_the_range_and_would_block_when_full() {
        let (socket, mut peer) = pair();
        let mut t = Transport::new(socket);
        let file = tempfile_with(&(0..=255u8).cycle().take(300_000).collect::<Vec<_>>());
        let mut offset = 10i64;
        let n = t.send_file(&file, &mut offset, 100).unwrap();
        assert_eq!((n, offset), (100, 110));
        let got = drain(&mut peer);
        assert_eq!(got, (10..110).map(|i| i as u8).collect::<Vec<_>>());
        let mut sent = 0;
        let err = loop {
            let left = 300_000 - offset as usize;
            match t.send_file(&file, &mut offset, left) {
                Ok(0) => panic!("the file ended before the socket filled"),
                Ok(n) => sent += n,
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "a full socket: {err}");
        assert_eq!(offset, 110 + sent as i64);
        assert_eq!(drain(&mut peer).len(), sent);
        let len = file.metadata().unwrap().len() as i64;
        let mut at_end = len;
        assert_eq!(t.send_file(&file, &mut at_end, 10).unwrap(), 0, "past the end");
    }

    /// A temporary file holding `data`, already unlinked.
    fn tempfile_with(data: &[u8]) -> File {
        let dir = std::env::temp_dir();
        let path = dir.join(format!(
            "appsrv-transport-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        file.write_all_at(data, 0).unwrap();
        file
    }

    #[test]
    fn tls_reads_decrypt_and_would_block_between_records() {
        let (mut t, mut client, mut peer) = tls_pair();
        let mut buf = [0u8; 64];
        assert!(would_block(t.read(&mut buf)), "nothing sent yet: WouldBlock");

        // A record that arrives in two pieces: the first half gives no plaintext, and no
        // byte of it is lost.
        client.writer().write_all(b"hello, transport").unwrap();
        let mut record = Vec::new();
        client.write_tls(&mut record).unwrap();
        let half = record.len() / 2;
        peer.write_all(&record[..half]).unwrap();
        assert!(would_block(t.read(&mut buf)), "half a record: WouldBlock");
        peer.write_all(&record[half..]).unwrap();
        let n = t.read(&mut buf[..5]).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert!(t.input_pending(), "the rest of the record is decrypted, waiting");
        let m = t.read(&mut buf).unwrap();
        assert_eq!(&buf[..m], b", transport");
        assert!(!t.input_pending());
        assert!(would_block(t.read(&mut buf)));

        // close_notify from the client: the end of the stream.
        client.send_close_notify();
        client.write_tls(&mut peer).unwrap();
        assert_eq!(t.read(&mut buf).unwrap(), 0);
        assert!(
            matches!(t.send_file(&tempfile_with(b"x"), &mut 0, 1), Err(e) if e.kind() == io::ErrorKind::Unsupported)
        );
    }

    /// What `tls_output_is_never_sent_twice_after_a_write_timeout` relies on, without a
    /// clock: a write to a full socket reports the plaintext rustls took, the records stay
    /// pending, and the client decrypts each byte once.
    #[test]
    fn tls_writes_report_what_was_taken_and_records_wait_when_the_socket_is_full() {
        let (mut t, mut client, mut peer) = tls_pair();
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut taken = 0;
        let mut partial = false;
        let mut filled = false;
        let mut received = Vec::new();
        while taken < data.len() {
            let (n, r) = t.write(&[IoSlice::new(&data[taken..])]);
            partial |= n > 0 && taken + n < data.len();
            taken += n;
            match r {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    filled = true;
                    assert!(t.records_pending(), "the records wait for the socket");
                    // The socket is full: writing records again would block, and rustls
                    // takes no more than its buffer limit meanwhile.
                    assert!(would_block(t.write_records()));
                    let (more, r) = t.write(&[IoSlice::new(&data[taken..])]);
                    assert!(would_block(r));
                    taken += more;
                    assert!(taken < data.len(), "a full socket, and all was taken");
                    received.extend(client_reads(&mut client, &mut peer));
                    while t.records_pending() {
                        match t.write_records() {
                            Ok(_) => {}
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                received.extend(client_reads(&mut client, &mut peer));
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(partial, "a write took part of the data, and said so");
        assert!(filled, "the socket filled up");
        while t.records_pending() {
            if let Err(e) = t.write_records() {
                assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
                received.extend(client_reads(&mut client, &mut peer));
            }
        }
        t.close_notify();
        assert!(t.records_pending());
        while t.records_pending() {
            if t.write_records().is_err() {
                received.extend(client_reads(&mut client, &mut peer));
            }
        }
        received.extend(client_reads(&mut client, &mut peer));
        assert_eq!(received.len(), data.len());
        assert!(received == data, "every byte once, in order");
        let mut rest = Vec::new();
        assert_eq!(
            client.reader().read_to_end(&mut rest).unwrap(),
            0,
            "close_notify: the end"
        );
    }

    #[test]
    fn tls_garbage_is_invalid_data_and_the_alert_waits_to_be_sent() {
        let (mut t, _client, mut peer) = tls_pair();
        peer.write_all(&[0x17, 0x03, 0x03, 0x00, 0x05, 1, 2, 3, 4, 5])
            .unwrap();
        let mut buf = [0u8; 64];
        let err = t.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().starts_with("TLS: "), "{err}");
        assert!(t.records_pending(), "the alert for the peer");
        assert!(t.write_records().unwrap() > 0);
        assert!(!drain(&mut peer).is_empty());
    }
}
