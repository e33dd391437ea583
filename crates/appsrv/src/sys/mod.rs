//! The raw system calls appsrv needs, behind safe functions.
//!
//! This is the one module that owns `fork`, the signal dispositions of worker processes
//! and shared memory: every `unsafe` primitive of the crate is defined here, with its
//! contract in a `# Safety` section, and so is every conversion of a descriptor number
//! into an `OwnedFd` or a `BorrowedFd` (descriptors received over `SCM_RIGHTS` come out of
//! [`recv_with_fds`] owned). Elsewhere, `unsafe` appears only as calls to these functions
//! whose contract no type can carry (forking a worker, a helper, the daemon's double fork;
//! exec; adopting inherited descriptors by number; closing the master's descriptors in a
//! new worker or a helper, and stray inherited ones at start), each with a `// SAFETY:`
//! comment saying why the contract holds: docs/ARCHITECTURE.md lists them ("`unsafe`
//! outside `sys/`").

use std::convert::Infallible;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::unistd::{ForkResult, Pid};

use crate::error::Error;

pub(crate) mod dgram;
pub(crate) use dgram::set_recv_pktinfo;

/// Exit statuses of worker processes, read by the master to say why a worker ended.
pub(crate) mod exit {
    /// The worker stopped on request, or finished normally.
    pub(crate) const OK: i32 = 0;
    /// A handler panicked; the worker closed that connection and exited to be replaced.
    pub(crate) const PANIC: i32 = 70; // EX_SOFTWARE
    /// The worker could not start: its factory failed or privileges could not be dropped.
    pub(crate) const START_FAILED: i32 = 78; // EX_CONFIG
    /// The worker found that its master had already gone.
    pub(crate) const ORPHANED: i32 = 75; // EX_TEMPFAIL
}

/// The monotonic clock in nanoseconds (`CLOCK_MONOTONIC`, shared by every process of the
/// server: the scoreboard's request clocks, the penalty table, the log's warnings); 0 if
/// it cannot be read.
pub(crate) fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// How many threads this process has, from `/proc/self/task`.
pub(crate) fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Which side of a fork this process is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forked {
    /// The original process; the child has this pid.
    Parent(Pid),
    /// The new process.
    Child,
}

/// Forks the process. The one place in appsrv that calls `fork(2)`.
///
/// Refuses with [`Error::Threads`] when the process has more than one thread: after
/// `fork` only the calling thread exists in the child, and any lock another thread held
/// (the allocator's, a logger's, stdio's) would stay locked forever.
///
/// # Safety
///
/// The caller must ensure that:
/// - no other thread can be started between the thread check and the `fork` call (the
///   master never starts threads);
/// - buffered output it cares about (logs, stdout) has been flushed, so that the child
///   does not write it a second time;
/// - in the child, it does not rely on state that fork does not copy faithfully (other
///   threads, file locks taken with `fcntl`, timers), and, unless the child is meant to
///   carry on as the program (the daemon's fork), it never returns into code that assumes
///   it runs in the parent: it ends with [`exit_now`], so that no destructor of the
///   parent's objects runs twice (see [`fork_child`]).
pub(crate) unsafe fn fork() -> Result<Forked, Error> {
    let threads = thread_count().map_err(|e| Error::sys("counting threads", e))?;
    if threads != 1 {
        return Err(Error::Threads { threads });
    }
    // SAFETY: the process has a single thread (checked just above, and the caller promises
    // none is started meanwhile), so the child inherits no lock held by another thread;
    // the caller upholds the rest of the contract.
    match unsafe { nix::unistd::fork() } {
        Ok(ForkResult::Parent { child }) => Ok(Forked::Parent(child)),
        Ok(ForkResult::Child) => Ok(Forked::Child),
        Err(errno) => Err(Error::sys("fork", errno)),
    }
}

/// Forks a child process that runs `child` and never returns into the caller; the parent
/// gets the child's pid.
///
/// In the child, `child` runs inside `catch_unwind`; it must end the process itself (it
/// returns `Infallible`, the stable spelling of `!`), and if it panics instead the child
/// exits at once with [`exit::PANIC`] through `_exit`, so no destructor or `atexit`
/// handler of the parent's objects ever runs in the child.
///
/// # Safety
///
/// As for [`fork`], except the last point, which this function guarantees. The child
/// starts with every signal blocked; `child` must set its handlers and unblock them.
pub(crate) unsafe fn fork_child<F: FnOnce() -> Infallible>(child: F) -> Result<Pid, Error> {
    // Block every signal across the fork: until the child has installed its own handlers,
    // a signal would run the parent's (the master's flag-and-pipe handlers) in the child
    // and be lost to it. Blocked, it stays pending and reaches the child's handler when
    // the child unblocks (see `install_worker_signals`); the parent restores its mask.
    let mut old = SigSet::empty();
    signal::sigprocmask(
        signal::SigmaskHow::SIG_SETMASK,
        Some(&SigSet::all()),
        Some(&mut old),
    )
    .map_err(|e| Error::sys("blocking signals", e))?;
    // SAFETY: the caller upholds `fork`'s contract; the child side never returns below.
    let forked = unsafe { fork() };
    if !matches!(forked, Ok(Forked::Child)) {
        let _ = signal::sigprocmask(signal::SigmaskHow::SIG_SETMASK, Some(&old), None);
    }
    match forked? {
        Forked::Parent(pid) => Ok(pid),
        Forked::Child => {
            // A panic must not unwind into the parent's stack frames, which the child
            // shares by copy: it would run the parent's destructors and return into the
            // master's loop inside a worker.
            let _ = panic::catch_unwind(AssertUnwindSafe(child));
            exit_now(exit::PANIC)
        }
    }
}

/// Ends the process at once with `code`, without running destructors or `atexit` handlers.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` is always safe to call; it does not return.
    unsafe { libc::_exit(code) }
}

/// Closes descriptors that a freshly forked worker inherited from its master but must not
/// hold (the master's signal pipe, the read end of the notification pipe).
///
/// # Safety
///
/// Only for a forked child, for descriptors whose owning objects (in the master's copied
/// stack and statics) are never used or dropped again in this process.
pub(crate) unsafe fn close_inherited(fds: &[std::os::fd::RawFd]) {
    for &fd in fds {
        // SAFETY: per this function's contract, nothing in this process uses `fd` again.
        unsafe { libc::close(fd) };
    }
}

/// Closes every open descriptor of this process but those in `keep`: for a privileged
/// helper, which must hold nothing of its worker's (listeners, the scoreboard, client
/// connections), close-on-exec or not. The descriptors are listed from `/proc/self/fd`
/// (without it, every number below the soft `RLIMIT_NOFILE` is tried).
///
/// # Safety
///
/// Only in a process that never uses (nor drops) the objects that own the closed
/// descriptors again: a forked child that ends with [`exit_now`].
pub(crate) unsafe fn close_all_but(keep: &[std::os::fd::RawFd]) -> io::Result<()> {
    use std::os::fd::RawFd;
    let listed: Option<Vec<RawFd>> = std::fs::read_dir("/proc/self/fd").ok().map(|dir| {
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect()
    });
    let candidates: Vec<RawFd> = match listed {
        Some(fds) => fds,
        None => {
            let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)?;
            (0..RawFd::try_from(soft).unwrap_or(RawFd::MAX)).collect()
        }
    };
    for fd in candidates {
        if !keep.contains(&fd) {
            // SAFETY: per this function's contract, nothing in this process uses `fd`
            // again; a number that is not open (the listing's own, closed by now) gives
            // EBADF, which is harmless.
            unsafe { libc::close(fd) };
        }
    }
    Ok(())
}

/// Whether [`become_subreaper`] succeeded in this process: remembered, not asked of the
/// kernel, whose answer a sandbox may forbid (`prctl(PR_GET_CHILD_SUBREAPER)` is outside
/// a helper's seccomp profile). Only a privileged helper sets it; the commands it forks
/// execute another program, so no process holds a stale copy.
static SUBREAPER: AtomicBool = AtomicBool::new(false);

/// Names this process `name` in `ps`, `top` and `/proc/PID/comm` (`PR_SET_NAME`, at most 15
/// bytes kept): a hybrid front is `front:PROGRAM`, so that an operator tells it from the
/// workers.
pub(crate) fn set_process_name(name: &str) {
    let mut bytes: Vec<u8> = name.bytes().filter(|b| *b != 0).take(15).collect();
    bytes.push(0);
    if let Ok(c) = std::ffi::CStr::from_bytes_with_nul(&bytes) {
        let _ = nix::sys::prctl::set_name(c);
    }
}

/// Makes this process a child subreaper (`PR_SET_CHILD_SUBREAPER`): a descendant that is
/// orphaned becomes its child, not init's.
pub(crate) fn become_subreaper() -> io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true).map_err(io::Error::from)?;
    SUBREAPER.store(true, Ordering::SeqCst);
    Ok(())
}

/// Whether this process made itself a child subreaper ([`become_subreaper`]).
pub(crate) fn is_subreaper() -> bool {
    SUBREAPER.load(Ordering::SeqCst)
}

/// This process's children (`/proc/self/task/*/children`).
pub(crate) fn children() -> Vec<Pid> {
    let mut pids = Vec::new();
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
                pids.extend(
                    text.split_whitespace()
                        .filter_map(|p| p.parse().ok())
                        .map(Pid::from_raw),
                );
            }
        }
    }
    pids
}

/// Closes the descriptors this process inherited from whatever executed it, other than
/// stdio (0–2) and those in `keep`, as daemon(7) asks of a daemon: a descriptor left open
/// by a shell, a supervisor or a test runner would otherwise stay open in the master and
/// in every worker it forks, for their whole lives. Returns the numbers closed, in
/// increasing order.
///
/// A descriptor counts as inherited when it is open *without* close-on-exec. `exec`
/// closes every close-on-exec descriptor, so all a process holds when its program starts
/// are of that kind; while every descriptor Rust's std, appsrv and the libraries it uses
/// open afterwards is close-on-exec (so is one adopted from a parent's list, by
/// [`adopt_fd`] or sd-notify's `listen_fds`). So the sweep never closes a descriptor that an
/// object of this program owns and would close again (a `File` opened before
/// `Server::run`, a socket kept by the name service), which closing *every* descriptor
/// (`close_range(3, ~0, 0)`) would. The open descriptors are listed from `/proc/self/fd`;
/// without `/proc`, every number below the soft `RLIMIT_NOFILE` is tried, as daemon(7)
/// suggests.
///
/// # Safety
///
/// Nothing in this process may own an open descriptor without close-on-exec, other than
/// stdio and those in `keep`: such a descriptor is closed here and its owner would use (or
/// close) a number that may by then name another file. The caller is the master at start,
/// before it opens anything, and tells the application to name what it keeps
/// (`Server::keep_fd`).
pub(crate) unsafe fn close_stray_fds(keep: &[std::os::fd::RawFd]) -> io::Result<Vec<std::os::fd::RawFd>> {
    use std::os::fd::RawFd;
    // Listed first, then closed: the directory's own descriptor (close-on-exec, and closed
    // once the listing is read) is never among those closed.
    let listed: Option<Vec<RawFd>> = std::fs::read_dir("/proc/self/fd").ok().map(|dir| {
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect()
    });
    let candidates: Box<dyn Iterator<Item = RawFd>> = match listed {
        Some(mut fds) => {
            fds.sort_unstable();
            Box::new(fds.into_iter())
        }
        None => {
            let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)?;
            Box::new(3..RawFd::try_from(soft).unwrap_or(RawFd::MAX))
        }
    };
    let mut closed = Vec::new();
    for fd in candidates {
        if fd <= 2 || keep.contains(&fd) {
            continue;
        }
        // SAFETY: F_GETFD only reads the descriptor's flags; a number that is not open
        // (the listing's own descriptor, or any number in the fallback) gives EBADF.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags < 0 || flags & libc::FD_CLOEXEC != 0 {
            continue;
        }
        // SAFETY: per this function's contract, nothing in this process owns an open
        // descriptor without close-on-exec that is not kept; close(2) on Linux releases
        // the number even when it reports an error, so there is nothing to retry.
        unsafe { libc::close(fd) };
        closed.push(fd);
    }
    Ok(closed)
}

/// Takes an advisory lock on the whole file, without waiting: `Ok(false)` when another
/// open file description holds a conflicting lock.
///
/// A `flock` lock belongs to the open file description: it is shared by every process
/// that inherited the descriptor and released only when the last copy is closed (never by
/// a forked child closing its copy's duplicate alone), which is what lets the daemon's
/// original process take the lock and the daemon keep it.
pub(crate) fn try_lock(fd: BorrowedFd<'_>, exclusive: bool) -> io::Result<bool> {
    let op = if exclusive { libc::LOCK_EX } else { libc::LOCK_SH } | libc::LOCK_NB;
    loop {
        // SAFETY: flock(2) on a valid borrowed descriptor has no memory-safety requirements.
        if unsafe { libc::flock(fd.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// A type that can live in memory shared by the master and its workers.
///
/// # Safety
///
/// Implementors must be valid when every byte is zero, hold no pointers or heap data, and
/// be safe to use through shared references from several processes at once: in practice,
/// `#[repr(C)]` structs of atomics.
pub(crate) unsafe trait SharedZeroed: Sync + 'static {}

/// Maps a zeroed `T` in shared memory: a memfd (`memfd_create`, close-on-exec) mapped
/// `MAP_SHARED`. The mapping is inherited by every process forked afterwards, and a store
/// by one is seen by all (a private mapping, like memmap2's `map_anon`, would give each
/// child its own copy); the memfd lets a re-executed worker (`--exec-workers`) map the same
/// memory again ([`map_shared_fd`]). The mapping lives as long as the process.
pub(crate) fn map_shared<T: SharedZeroed>() -> io::Result<(&'static T, OwnedFd)> {
    let (one, fd) = map_shared_slice::<T>(1)?;
    Ok((&one[0], fd))
}

/// Maps the `T` that another process made with [`map_shared`], from its memfd.
pub(crate) fn map_shared_fd<T: SharedZeroed>(fd: OwnedFd) -> io::Result<&'static T> {
    let len = std::mem::size_of::<T>();
    if memfd_len(&fd)? < len {
        return Err(smaller_than_expected());
    }
    // SAFETY: the memfd is at least `len` long (checked above).
    let ptr = unsafe { map_len(&fd, len) }?;
    // SAFETY: as in `map_shared`; the memory only ever held valid `T` values (written by
    // processes of this program through `SharedZeroed` types). The mapping stays valid
    // after the descriptor is closed.
    Ok(unsafe { ptr.cast::<T>().as_ref() })
}

/// Maps `n` zeroed `T`s in shared memory, as [`map_shared`] does one, for a table whose
/// size is known only at run time. The memfd is sized at once, but its pages are
/// allocated when first touched: a large table costs only what is used.
pub(crate) fn map_shared_slice<T: SharedZeroed>(n: usize) -> io::Result<(&'static [T], OwnedFd)> {
    let len = std::mem::size_of::<T>()
        .checked_mul(n)
        .filter(|len| isize::try_from(*len).is_ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "shared table too large"))?;
    let fd = shared_memfd(len)?;
    // SAFETY: the memfd was just sized to hold `n` `T`s.
    let ptr = unsafe { map_len(&fd, len) }?;
    // SAFETY: page-aligned, zero-filled (valid for T per `SharedZeroed`), `n` elements long
    // (at most isize::MAX bytes, checked above), never unmapped, only ever accessed through
    // shared references.
    Ok((
        unsafe { std::slice::from_raw_parts(ptr.cast::<T>().as_ptr(), n) },
        fd,
    ))
}

/// Maps the `T`s that another process made with [`map_shared_slice`], from its memfd: as
/// many as it holds.
pub(crate) fn map_shared_slice_fd<T: SharedZeroed>(fd: OwnedFd) -> io::Result<&'static [T]> {
    let len = memfd_len(&fd)?;
    let size = std::mem::size_of::<T>().max(1);
    if len % size != 0 || len == 0 {
        return Err(smaller_than_expected());
    }
    // SAFETY: the memfd is `len` bytes long (its size, sealed by `shared_memfd`).
    let ptr = unsafe { map_len(&fd, len) }?;
    // SAFETY: as in `map_shared_slice`: `len / size` elements fit the mapping exactly, and
    // the memory only ever held valid `T` values.
    Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<T>().as_ptr(), len / size) })
}

/// Zeroes `len` bytes from `offset` of shared memory made by [`map_shared_slice`], in
/// every process that maps it, and gives the kernel back its whole pages in that range
/// (`fallocate(FALLOC_FL_PUNCH_HOLE)`: a later access faults in a zeroed page). Atomic
/// per byte for the other processes: a concurrent reader sees each value either as it was
/// or as zero.
pub(crate) fn zero_shared(fd: BorrowedFd<'_>, offset: usize, len: usize) -> io::Result<()> {
    use nix::fcntl::FallocateFlags;
    let off = |v: usize| i64::try_from(v).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
    nix::fcntl::fallocate(
        fd,
        FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
        off(offset)?,
        off(len)?,
    )?;
    Ok(())
}

fn smaller_than_expected() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "the shared memory is smaller than expected (a different version of the program?)",
    )
}

/// The size of a memfd.
fn memfd_len(fd: &OwnedFd) -> io::Result<usize> {
    Ok(usize::try_from(nix::sys::stat::fstat(fd)?.st_size).unwrap_or(0))
}

/// A new memfd (`MFD_CLOEXEC`) named `name` that holds `bytes`, its file offset at their
/// end (a reader of the same open file reads from offset 0: `pread`). Hybrid mode spools
/// a request larger than a hand-off message into one, to pass it as a descriptor.
pub(crate) fn memfd_with(name: &std::ffi::CStr, bytes: &[u8]) -> io::Result<OwnedFd> {
    use nix::sys::memfd::MFdFlags;
    let fd = nix::sys::memfd::memfd_create(name, MFdFlags::MFD_CLOEXEC)?;
    let mut file = std::fs::File::from(fd);
    io::Write::write_all(&mut file, bytes)?;
    Ok(OwnedFd::from(file))
}

/// A new memfd (close-on-exec) of `len` bytes (at least 1), zero-filled, sealed at its
/// size.
fn shared_memfd(len: usize) -> io::Result<OwnedFd> {
    use nix::fcntl::{FcntlArg, SealFlag};
    use nix::sys::memfd::MFdFlags;
    let fd = nix::sys::memfd::memfd_create(
        c"appsrv-shared",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )?;
    nix::unistd::ftruncate(
        &fd,
        i64::try_from(len.max(1)).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
    )?;
    // Sealed at its size: a process holding the descriptor cannot shrink it, which would
    // make every other process's next access to the mapping a SIGBUS. (Punching a hole,
    // `zero_shared`, keeps the size.)
    nix::fcntl::fcntl(
        &fd,
        FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL),
    )?;
    Ok(fd)
}

/// Maps the first `len` bytes (at least 1) of `fd`, shared, readable and writable.
///
/// # Safety
///
/// `fd` must be at least `len` bytes long (a shorter file makes accesses past its end a
/// SIGBUS).
unsafe fn map_len(fd: &OwnedFd, len: usize) -> io::Result<std::ptr::NonNull<std::ffi::c_void>> {
    let len = std::num::NonZeroUsize::new(len.max(1)).expect("non-zero");
    // SAFETY: a new mapping of `len` bytes of the memfd at an address of the kernel's
    // choice touches no existing memory; the caller vouches for the file's length.
    let ptr = unsafe {
        nix::sys::mman::mmap(
            None,
            len,
            nix::sys::mman::ProtFlags::PROT_READ | nix::sys::mman::ProtFlags::PROT_WRITE,
            nix::sys::mman::MapFlags::MAP_SHARED,
            fd,
            0,
        )
    }?;
    Ok(ptr)
}

/// The master's wake-up eventfd, inherited by the workers (-1 before it exists).
static WAKE_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Records the master's wake-up eventfd; called by the master before the first fork.
pub(crate) fn set_wake_fd(fd: std::os::fd::RawFd) {
    WAKE_FD.store(fd, Ordering::SeqCst);
}

/// The master's wake-up eventfd, if set (handed to re-executed workers).
pub(crate) fn wake_fd() -> Option<std::os::fd::RawFd> {
    Some(WAKE_FD.load(Ordering::SeqCst)).filter(|fd| *fd >= 0)
}

/// Wakes the master from its `poll` (a worker saw the pool run short of idle workers).
/// One 8-byte `write` to an eventfd; never blocks (the eventfd is non-blocking).
pub(crate) fn wake_master() {
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to a descriptor the master created and
        // keeps open for its whole life (inherited by the workers); an error (the counter
        // is saturated, or the master is gone) is of no consequence.
        let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    }
}

/// `TCP_LISTEN` in the kernel's TCP state enum (include/net/tcp_states.h).
const TCP_LISTEN: u8 = 10;

/// The accept queue of a listening TCP socket: `(waiting connections, capacity)`, from
/// `TCP_INFO` (for a listener, Linux reports the queue length in `tcpi_unacked` and the
/// backlog in `tcpi_sacked`). `None` for other sockets.
pub(crate) fn listen_queue(fd: BorrowedFd<'_>) -> Option<(u32, u32)> {
    let (info, _) = tcp_info(fd)?;
    (info.tcpi_state == TCP_LISTEN).then_some((info.tcpi_unacked, info.tcpi_sacked))
}

/// `TCP_INFO` of a socket, with the number of bytes the kernel filled in (an older kernel
/// fills in less than the structure); `None` for a socket that is not TCP.
fn tcp_info(fd: BorrowedFd<'_>) -> Option<(libc::tcp_info, usize)> {
    // SAFETY: tcp_info is plain data, valid when zeroed.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, which is that large.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (r == 0).then_some((info, len as usize))
}

/// What the TCP peer of a socket has acknowledged so far, in bytes (`TCP_INFO`'s
/// `tcpi_bytes_acked`, Linux 4.1 and later), and the socket's send MSS (a peer's window
/// opens one segment at a time, so progress is seen in steps of about that much). `None`
/// for a socket that is not TCP, or on an older kernel. (A Unix socket has no such count:
/// its `SIOCOUTQ` is the memory of the queued buffers, which falls only when the reader has
/// consumed a whole one.)
pub(crate) fn peer_progress(fd: BorrowedFd<'_>) -> Option<(u64, u32)> {
    // A kernel older than 4.1 returns a shorter structure without the field.
    let acked_end = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + 8;
    let (info, _) = tcp_info(fd).filter(|(_, len)| *len >= acked_end)?;
    Some((info.tcpi_bytes_acked, info.tcpi_snd_mss))
}

/// Whether core dumps are enabled for this process (a soft `RLIMIT_CORE` above zero): the
/// master then kills a stuck worker with SIGABRT first, so that its core shows where it was.
pub(crate) fn core_dumps_enabled() -> bool {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_CORE).is_ok_and(|(soft, _)| soft > 0)
}

/// Whether stderr is this process's controlling terminal, set to `tostop` (`stty tostop`):
/// the terminal then sends TTOU to a process group other than its foreground group that
/// writes to it, which stops the writer unless it catches the signal, and makes it retry
/// the write for ever if it does.
pub(crate) fn stderr_is_tostop_terminal() -> bool {
    // SAFETY: a zeroed termios is a valid value for tcgetattr to fill in; both calls only
    // read the state of whatever descriptor 2 is (and fail if it is no terminal, or not
    // this process's controlling terminal for tcgetpgrp).
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        libc::tcgetattr(2, &mut t) == 0 && t.c_lflag & libc::TOSTOP != 0 && libc::tcgetpgrp(2) > 0
    }
}

/// Replaces this process with the program open at `exe` (`fexecve`), keeping open the
/// descriptors `keep` (made inheritable here) and nothing else: every other descriptor
/// appsrv opens is close-on-exec. Returns only if the exec failed.
///
/// # Safety
///
/// Call it only in a freshly forked child that is about to be replaced: `keep` must be open
/// descriptors of this process, and clearing their close-on-exec flag must not matter to
/// anything else (the parent's table is not affected by the child's flags).
pub(crate) unsafe fn exec_keeping(
    exe: &std::fs::File,
    argv: &[std::ffi::CString],
    env: &[std::ffi::CString],
    keep: &[std::os::fd::RawFd],
) -> io::Error {
    for &fd in keep {
        // SAFETY: the caller guarantees `fd` is open in this process; the borrow ends with
        // this statement.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        if let Err(e) = nix::fcntl::fcntl(
            borrowed,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        ) {
            return io::Error::other(format!("making descriptor {fd} inheritable: {e}"));
        }
    }
    match nix::unistd::fexecve(exe, argv, env) {
        Ok(never) => match never {},
        Err(e) => io::Error::other(format!("fexecve: {e}")),
    }
}

/// Takes ownership of a descriptor this process inherited across `exec` (a binary
/// upgrade's manifest, systemd's `LISTEN_FDS`), after checking that it is open, and makes
/// it close-on-exec.
///
/// # Safety
///
/// `fd` must be a descriptor inherited by this process that nothing else in it owns or
/// will close (the numbers come from the parent's explicit list).
pub(crate) unsafe fn adopt_fd(fd: std::os::fd::RawFd) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    if fd < 3 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor {fd} is stdio"),
        ));
    }
    // SAFETY: F_GETFD only reads the descriptor's flags; an invalid number gives EBADF.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: per this function's contract, the open descriptor is ours alone.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    nix::fcntl::fcntl(
        &owned,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    Ok(owned)
}

/// Gives a command exactly the descriptors listed, at the given numbers: each
/// `(source, target)` is `dup2`ed in the child between fork and exec (which clears
/// close-on-exec on the target, and only there). Every other descriptor of the parent is
/// close-on-exec, so the new program holds these and stdio, nothing else. The sources
/// must not be among the targets (take them from a high range, with `F_DUPFD_CLOEXEC`).
pub(crate) fn pass_fds(cmd: &mut std::process::Command, fds: Vec<(std::os::fd::RawFd, std::os::fd::RawFd)>) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure only calls dup2, which is async-signal-safe, and allocates
    // nothing (the list was built before the fork).
    unsafe {
        cmd.pre_exec(move || {
            for &(source, target) in &fds {
                if libc::dup2(source, target) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Set by the worker's handler for TERM, INT and QUIT.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    // Only an atomic store (and the async worker's wake-up write): async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
    poke_worker();
}

/// An async worker's wake-up eventfd (-1: none), written by the stop and reopen signals'
/// handlers: the worker's runtime cannot let signals in around its own `epoll_wait` as
/// the event loop does (`epoll_pwait`), so it watches this descriptor instead.
static WORKER_WAKE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Makes `fd` (a non-blocking eventfd the worker keeps open for its life) the one the
/// stop and reopen signals write to.
pub(crate) fn set_worker_wake_fd(fd: std::os::fd::RawFd) {
    WORKER_WAKE.store(fd, Ordering::SeqCst);
}

/// Called from a signal handler: one 8-byte `write` to the wake-up eventfd, if any.
fn poke_worker() {
    let fd = WORKER_WAKE.load(Ordering::SeqCst);
    if fd < 0 {
        return;
    }
    let one: u64 = 1;
    // SAFETY: errno is the interrupted code's: saved and put back around the write, which
    // is async-signal-safe and writes 8 bytes from a live local to an eventfd the worker
    // keeps open for its whole life; its outcome does not matter (a saturated counter
    // still reads as readable).
    unsafe {
        let errno = libc::__errno_location();
        let saved = *errno;
        let _ = libc::write(fd, (&one as *const u64).cast(), 8);
        *errno = saved;
    }
}

/// Set by the worker's handler for USR1 (reopen the log file).
static REOPEN: AtomicBool = AtomicBool::new(false);

extern "C" fn on_reopen_signal(_: libc::c_int) {
    REOPEN.store(true, Ordering::SeqCst);
    poke_worker();
}

extern "C" fn on_ignored_signal(_: libc::c_int) {}

/// The signal the master sends a worker that waits for the next request of a keep-alive
/// connection when clients queue while no worker is idle: its blocking `read` returns
/// `EINTR` and the request loop asks the keep-alive guard again (`worker/guard.rs`).
///
/// SIGURG, because nothing else sends it to appsrv's processes: the kernel raises it only
/// for a socket's urgent data when the process has claimed the socket with `F_SETOWN`
/// (appsrv never does), no terminal or service manager sends it, and its default action is
/// to ignore it, so a process that did not install the worker's handler (the master, a
/// command a worker starts) is unaffected by a stray one. (The Go runtime picked it for
/// its preemption signal for the same reasons.)
pub(crate) const GUARD_SIGNAL: Signal = Signal::SIGURG;

/// Sends [`GUARD_SIGNAL`] to worker `pid`; false if it is gone.
pub(crate) fn wake_worker(pid: Pid) -> bool {
    signal::kill(pid, GUARD_SIGNAL).is_ok()
}

/// Whether USR1 arrived since the last call (the flag is cleared).
pub(crate) fn take_reopen_request() -> bool {
    REOPEN.swap(false, Ordering::SeqCst)
}

/// Whether the worker was asked to stop (TERM, INT or QUIT arrived).
pub(crate) fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Replaces the master's signal dispositions with the worker's, in a freshly forked worker.
///
/// - TERM, INT and QUIT set the stop flag. They are installed *without* `SA_RESTART`, so a
///   worker blocked in `accept` or `read` gets `EINTR` and notices the stop.
/// - USR1 sets the reopen flag (the log file is reopened between connections), also
///   without `SA_RESTART`, so that an idle worker reopens at once.
/// - URG ([`GUARD_SIGNAL`]) is caught by a handler that does nothing, installed without
///   `SA_RESTART`: the master sends it to wake a worker blocked in `read` between
///   keep-alive requests when clients queue (the interrupted reads that are not at a
///   request boundary are retried).
/// - HUP, USR2, WINCH, TTIN and TTOU are caught by a handler that does nothing
///   (rather than ignored), so that a worker survives the signals meant for its master
///   when they reach the whole process group, and commands the worker spawns still start
///   with default dispositions (exec resets caught signals, not ignored ones).
/// - CHLD goes back to its default; PIPE stays ignored, so a write to a closed connection
///   is an `EPIPE` error rather than a silent death (std resets it for spawned commands).
/// - The signal mask is emptied (the master blocked every signal across the fork), so a
///   stop signal sent while the worker was starting is delivered now, to these handlers.
pub(crate) fn install_worker_signals() -> io::Result<()> {
    let stop = SigAction::new(
        SigHandler::Handler(on_stop_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    let noop = SigAction::new(
        SigHandler::Handler(on_ignored_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    let reopen = SigAction::new(
        SigHandler::Handler(on_reopen_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    let recheck = SigAction::new(
        SigHandler::Handler(on_ignored_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    let table = [
        (Signal::SIGTERM, &stop),
        (Signal::SIGINT, &stop),
        (Signal::SIGQUIT, &stop),
        (Signal::SIGHUP, &noop),
        (Signal::SIGUSR1, &reopen),
        (Signal::SIGUSR2, &noop),
        (Signal::SIGWINCH, &noop),
        (Signal::SIGTTIN, &noop),
        (Signal::SIGTTOU, &noop),
        (GUARD_SIGNAL, &recheck),
        (Signal::SIGCHLD, &default),
        (Signal::SIGALRM, &default),
        (Signal::SIGPIPE, &ignore),
    ];
    for (sig, action) in table {
        // SAFETY: the handlers installed here only store to an atomic or do nothing, both
        // async-signal-safe; replacing the master's handlers is the purpose of this call.
        unsafe { signal::sigaction(sig, action) }.map_err(io::Error::from)?;
    }
    reset_inherited_ignores(&table.map(|(sig, _)| sig as i32))?;
    signal::sigprocmask(signal::SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
        .map_err(io::Error::from)
}

/// Puts back the default disposition of every signal that the process inherited ignored
/// (a master started under `nohup`, or by a parent that ignores signals), except those in
/// `keep`: an ignored disposition survives `execve`, so the commands a worker starts would
/// otherwise inherit it. The signals the C library reserves for itself (32 and 33 with
/// glibc, below `SIGRTMIN`) cannot be changed through it and are left as they are.
fn reset_inherited_ignores(keep: &[i32]) -> io::Result<()> {
    let standard = 1..32;
    let realtime = libc::SIGRTMIN()..=libc::SIGRTMAX();
    for sig in standard.chain(realtime) {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP || keep.contains(&sig) {
            continue;
        }
        // SAFETY: a zeroed sigaction is a valid out-parameter; with a null new action,
        // sigaction only reads the current disposition.
        let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `current` outlives the call.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut current) } != 0 {
            continue; // not a signal this C library lets us touch
        }
        if current.sa_sigaction == libc::SIG_IGN {
            // SAFETY: a zeroed sigaction with SIG_DFL and an empty mask is the default
            // disposition; installing it runs no code of ours in a signal context.
            let mut default: libc::sigaction = unsafe { std::mem::zeroed() };
            default.sa_sigaction = libc::SIG_DFL;
            // SAFETY: as above; both pointers are to live locals.
            if unsafe { libc::sigaction(sig, &default, std::ptr::null_mut()) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Arranges for this process to be killed when its parent dies, then checks that the
/// parent is still `parent` (it may have died before the request took effect).
///
/// Must be called after any credential change: the kernel clears the parent-death signal
/// when the process's uid or gid changes.
pub(crate) fn die_with_parent(parent: Pid) -> io::Result<bool> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
    Ok(nix::unistd::getppid() == parent)
}

/// The kernel's cap on listen backlogs (`net.core.somaxconn`), if it can be read.
pub(crate) fn somaxconn() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// `t` as a `poll(2)` timeout: whole milliseconds rounded up, so that a wait never ends
/// before its deadline; past `i32::MAX` ms, the longest `poll` takes.
pub(crate) fn poll_timeout(t: std::time::Duration) -> nix::poll::PollTimeout {
    let ms = i32::try_from(t.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
    nix::poll::PollTimeout::try_from(ms).unwrap_or(nix::poll::PollTimeout::MAX)
}

/// The signals whose handlers set the worker's flags (stop, reopen): an event loop keeps
/// them blocked while it works and lets them in only while it waits
/// ([`epoll_wait_signals`]), so that a signal that arrives between its look at the flags
/// and the wait is not lost until the next event. Commands a handler spawns start with an
/// empty mask (std resets it in the child).
fn flag_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGQUIT, Signal::SIGUSR1] {
        set.add(s);
    }
    set
}

/// Blocks [`flag_signals`] in this (single-threaded) worker; returns the mask to wait
/// with (the previous one, without them).
pub(crate) fn block_flag_signals() -> io::Result<SigSet> {
    let mut old = SigSet::empty();
    nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_BLOCK,
        Some(&flag_signals()),
        Some(&mut old),
    )?;
    for s in flag_signals().iter() {
        old.remove(s);
    }
    Ok(old)
}

/// Gives the allocator's free memory back to the system (glibc's `malloc_trim(0)`, which
/// also releases free pages in the middle of the heap, not only at its top). Buffers of a
/// flood of large requests are freed when the clients go, but glibc keeps freed blocks
/// below its mmap threshold (128 KiB) for reuse: 1,000 rejected 40 KiB heads left an event
/// worker 18 MiB larger for good (issue 31). Does nothing with another C library.
pub(crate) fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks and trims the allocator's own free lists; it takes
    // the allocator's locks like any malloc call, and this process's allocator is glibc's.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// 64 random bits from the kernel (`getrandom(2)`, which does not block once the system's
/// pool is initialised); the time and pid when it fails, which only weakens a hash key.
pub(crate) fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into `v`, which is 8 bytes long.
    let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, 0) };
    if n == 8 {
        v
    } else {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(32)
    }
}

/// Lets in the flag signals that are pending while blocked: their handlers run now (they
/// set their flags), and the mask is put back. For a loop that never sleeps: an
/// `epoll_pwait` that finds events ready returns them without delivering a pending signal
/// (the kernel restores the blocked mask unless the wait was interrupted), so a worker under
/// a steady flood of datagrams, or of requests, would never see its stop. One `sigpending`
/// when nothing is pending; three system calls when something is. `wait_mask` is
/// [`block_flag_signals`]' result.
pub(crate) fn let_in_pending_signals(wait_mask: &SigSet) {
    // SAFETY: sigset_t is plain data, filled in by sigpending.
    let mut pending: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: sigpending writes the set of pending signals into `pending`.
    if unsafe { libc::sigpending(&mut pending) } != 0 {
        return;
    }
    let any_pending = flag_signals().iter().any(|s| {
        // SAFETY: `pending` is a valid set filled in above; sigismember only reads it.
        unsafe { libc::sigismember(&pending, s as libc::c_int) == 1 }
    });
    if !any_pending {
        return;
    }
    let mut blocked = SigSet::empty();
    if nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(wait_mask),
        Some(&mut blocked),
    )
    .is_ok()
    {
        // The pending signals were delivered on the way out of the call above.
        let _ =
            nix::sys::signal::sigprocmask(nix::sys::signal::SigmaskHow::SIG_SETMASK, Some(&blocked), None);
    }
}

/// `epoll_pwait(2)`: waits for events on `epoll` for at most `timeout` (`None`: no limit)
/// with the signal mask `mask` in place for the wait only (atomically: see
/// [`block_flag_signals`]). Returns the number of events written to the front of
/// `events`; `EINTR` when a signal arrived.
pub(crate) fn epoll_wait_signals(
    epoll: &nix::sys::epoll::Epoll,
    events: &mut [nix::sys::epoll::EpollEvent],
    timeout: Option<std::time::Duration>,
    mask: &SigSet,
) -> nix::Result<usize> {
    let ms = match timeout {
        None => -1,
        Some(t) => i32::try_from(t.as_micros().div_ceil(1000)).unwrap_or(i32::MAX),
    };
    let max = i32::try_from(events.len()).unwrap_or(i32::MAX);
    // SAFETY: `EpollEvent` is `#[repr(transparent)]` over `libc::epoll_event`, so the
    // slice is `max` valid, writable `epoll_event`s; the kernel writes at most `max`. The
    // epoll descriptor is borrowed for the call, and `mask` is a valid `sigset_t`.
    let n = unsafe {
        libc::epoll_pwait(
            std::os::fd::AsRawFd::as_raw_fd(&epoll.0),
            events.as_mut_ptr().cast::<libc::epoll_event>(),
            max,
            ms,
            mask.as_ref(),
        )
    };
    nix::errno::Errno::result(n).map(|n| n as usize)
}

/// Sends the concatenation of `parts` as one message on the Unix socket `to`, with `fds`
/// (`SCM_RIGHTS`, none when empty), again after `EINTR`; `MSG_NOSIGNAL`, and
/// `MSG_DONTWAIT` when `dontwait` (a full socket is then `WouldBlock`). The one sender of
/// descriptors: the hand-off channel, the log reopening, the privileged helper's wire.
pub(crate) fn send_with_fds(
    to: BorrowedFd<'_>,
    parts: &[&[u8]],
    fds: &[std::os::fd::RawFd],
    dontwait: bool,
) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags};
    let iov: Vec<io::IoSlice<'_>> = parts.iter().map(|p| io::IoSlice::new(p)).collect();
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
    let mut flags = MsgFlags::MSG_NOSIGNAL;
    if dontwait {
        flags |= MsgFlags::MSG_DONTWAIT;
    }
    loop {
        match nix::sys::socket::sendmsg::<()>(to.as_raw_fd(), &iov, cmsgs, flags, None) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// The most descriptors the kernel passes in one message (`SCM_MAX_FD`, 253 since Linux
/// 2.6.38): a sender's `sendmsg` with more fails (`EINVAL`).
const SCM_MAX_FD: usize = 253;

/// `CMSG_SPACE` of one `SCM_RIGHTS` message of [`SCM_MAX_FD`] descriptors: with this much
/// room for control data, no message on appsrv's sockets (which ask for no credentials or
/// security labels) can have its descriptors cut (`MSG_CTRUNC`).
// SAFETY: CMSG_SPACE is arithmetic on its argument; it touches no memory.
const FD_SPACE: usize =
    unsafe { libc::CMSG_SPACE((SCM_MAX_FD * std::mem::size_of::<std::os::fd::RawFd>()) as u32) } as usize;

/// The control buffer of [`recv_with_fds`], on the stack, aligned for a `cmsghdr`.
#[repr(C, align(8))]
struct FdSpace([u8; FD_SPACE]);

/// Why [`recv_with_fds`] returned no message.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecvError {
    /// The system call failed: `WouldBlock` (nothing waiting, under `dontwait` or on a
    /// non-blocking socket), `Interrupted` (a signal: returned, never retried here, so that
    /// a caller sleeping in the call sees its stop signal), or another error.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The message was longer than the buffers (`MSG_TRUNC`): they hold its first `len`
    /// bytes; the descriptors that came with it are closed.
    #[error("a message longer than the {len} bytes of room for it")]
    Truncated {
        /// The bytes received into the buffers (all of them).
        len: usize,
    },
    /// The message carried more descriptors than the room for them (`MSG_CTRUNC`), which
    /// cannot happen with room for `SCM_MAX_FD` on a socket that asks for no other control
    /// data; the buffers hold its first `len` bytes. (The descriptors the kernel did
    /// install are then not listed, and stay open.)
    #[error("a message with more descriptors than room for them")]
    FdsTruncated {
        /// The bytes received into the buffers.
        len: usize,
    },
}

/// Receives one message from the Unix socket `from` into `bufs` (scattered, in order), with
/// its descriptors (`SCM_RIGHTS`), owned and close-on-exec (`MSG_CMSG_CLOEXEC`): returns
/// how many bytes came and the descriptors. `dontwait`: `MSG_DONTWAIT` (otherwise the call
/// blocks unless the socket does not). `Ok((0, []))` is the peer's end of file, or on a
/// `SOCK_SEQPACKET` socket an empty message, which the caller tells apart if it needs to.
/// A message cut short by the buffers is [`RecvError::Truncated`], its descriptors closed,
/// so that no caller mistakes part of a message for a whole one; `EINTR` is returned as
/// `Interrupted`. The one receiver of descriptors, beside [`send_with_fds`]: the hand-off
/// channel, the log reopening, the privileged helper's wire.
pub(crate) fn recv_with_fds(
    from: BorrowedFd<'_>,
    bufs: &mut [io::IoSliceMut<'_>],
    dontwait: bool,
) -> Result<(usize, Vec<OwnedFd>), RecvError> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags};
    use std::os::fd::FromRawFd;
    let mut space = FdSpace([0; FD_SPACE]);
    let mut flags = MsgFlags::MSG_CMSG_CLOEXEC;
    if dontwait {
        flags |= MsgFlags::MSG_DONTWAIT;
    }
    let msg = nix::sys::socket::recvmsg::<()>(from.as_raw_fd(), bufs, Some(&mut space.0), flags)
        .map_err(io::Error::from)?;
    let (len, got) = (msg.bytes, msg.flags);
    // Owned at once, so that every return below closes them unless the caller gets them.
    let mut fds: Vec<OwnedFd> = Vec::new();
    if let Ok(cmsgs) = msg.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel has just installed these descriptors in this process
                // for this message (SCM_RIGHTS); nothing else knows their numbers.
                fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
    }
    if got.contains(MsgFlags::MSG_TRUNC) {
        return Err(RecvError::Truncated { len });
    }
    if got.contains(MsgFlags::MSG_CTRUNC) {
        return Err(RecvError::FdsTruncated { len });
    }
    Ok((len, fds))
}

/// The bytes queued for reading on the socket `fd` (`FIONREAD`, `SIOCINQ`).
pub(crate) fn queued_bytes(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which is valid.
    match unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut queued) } {
        0 => Ok(usize::try_from(queued).unwrap_or(0)),
        _ => Err(io::Error::last_os_error()),
    }
}

/// The bytes the socket `fd` has queued to send that its peer has not acknowledged
/// (`SIOCOUTQ`, `TIOCOUTQ`): what the kernel would go on trickling to a slow reader after a
/// plain close.
pub(crate) fn unsent_bytes(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut queued: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ on a socket) writes one int through the pointer, which
    // is valid.
    match unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut queued) } {
        0 => Ok(usize::try_from(queued).unwrap_or(0)),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Sets the descriptor's blocking mode in one system call (`FIONBIO`; socket2 and std
/// take two, `F_GETFL` then `F_SETFL`). The mode belongs to the open file, which every
/// process holding a copy of the descriptor shares.
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    let mut value: libc::c_int = on.into();
    // SAFETY: FIONBIO reads one int through the pointer, which is valid.
    match unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONBIO, &mut value) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// A new descriptor for `fd`'s open file, numbered `min` or above, close-on-exec
/// (`F_DUPFD_CLOEXEC`): for sources that must not collide with the numbers a new program
/// is given.
pub(crate) fn dup_at_least(fd: BorrowedFd<'_>, min: std::os::fd::RawFd) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    let raw = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(min))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor, which nothing owns yet.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Whether any of `fds` is readable now (a zero-timeout `poll`): for listening sockets,
/// whether a connection waits in one of their queues. An error counts as "no".
pub(crate) fn any_readable<F: std::os::fd::AsFd>(fds: &[F]) -> bool {
    if fds.is_empty() {
        return false; // no system call for nothing to ask (hybrid mode without TLS)
    }
    let mut polled: Vec<nix::poll::PollFd<'_>> = fds
        .iter()
        .map(|f| nix::poll::PollFd::new(f.as_fd(), nix::poll::PollFlags::POLLIN))
        .collect();
    matches!(nix::poll::poll(&mut polled, nix::poll::PollTimeout::ZERO), Ok(n) if n > 0)
}

/// A value that holds one open descriptor for its whole life, which `as_raw_fd` always
/// returns: what the async runtime's reactor may watch ([`watch_async`]).
///
/// # Safety
///
/// An implementor guarantees `AsyncFd::register_with_interest`'s contract for every value
/// of the type: `as_raw_fd` returns a valid, open descriptor, always the same one, which
/// stays open and refers to the same open file description until the value is dropped
/// (it owns it, or borrows it for its lifetime), and no method replaces it.
pub(crate) unsafe trait StableFd: AsRawFd {}

// SAFETY: an `OwnedFd` owns its descriptor and closes it only when dropped; its number
// never changes.
unsafe impl StableFd for OwnedFd {}

// SAFETY: the borrow keeps the descriptor open for the `BorrowedFd`'s lifetime, which
// bounds the `AsyncFd` that holds it; its number never changes.
unsafe impl StableFd for BorrowedFd<'_> {}

// SAFETY: `EpollFd` owns its epoll instance (its field is private, never replaced) and
// closes it only when dropped.
unsafe impl StableFd for EpollFd {}

/// Registers `inner`'s descriptor with the current tokio runtime's reactor for
/// `interest`: the one place that calls `AsyncFd::register_with_interest` (the async
/// driver's signals' eventfd, listeners and connections; the helper's channel in
/// `Helper::call_async`). Must run inside a runtime.
pub(crate) fn watch_async<T: StableFd>(
    inner: T,
    interest: tokio::io::Interest,
) -> io::Result<tokio::io::unix::AsyncFd<T>> {
    // SAFETY: `StableFd`'s contract is `register_with_interest`'s: the descriptor is open,
    // the same one, and owned or borrowed for the value's life, which the `AsyncFd` owns.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(inner, interest) }.map_err(io::Error::from)
}

/// An epoll instance as a descriptor the async runtime can watch ([`watch_async`]): the
/// async driver's listeners, registered with `EPOLLEXCLUSIVE`, which tokio's reactor has
/// no registration for.
#[derive(Debug)]
pub(crate) struct EpollFd(nix::sys::epoll::Epoll);

impl EpollFd {
    /// A new epoll instance, close-on-exec.
    pub(crate) fn new() -> nix::Result<Self> {
        nix::sys::epoll::Epoll::new(nix::sys::epoll::EpollCreateFlags::EPOLL_CLOEXEC).map(EpollFd)
    }

    /// The instance, to add, delete and wait.
    pub(crate) fn epoll(&self) -> &nix::sys::epoll::Epoll {
        &self.0
    }
}

impl AsRawFd for EpollFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.0.as_raw_fd()
    }
}

/// For tests of descriptor passing: copies of a pipe's write end to send, and its read end,
/// which sees its end of file once every copy is closed.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct Probe {
    read: OwnedFd,
}

#[cfg(test)]
impl Probe {
    /// A probe and `n` copies of its write end.
    pub(crate) fn new(n: usize) -> (Probe, Vec<OwnedFd>) {
        use nix::fcntl::OFlag;
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).unwrap();
        let copies = (0..n).map(|_| write.try_clone().unwrap()).collect();
        (Probe { read }, copies)
    }

    /// Whether every copy of the write end was closed. Another test thread that forks (to
    /// run a command) holds copies between its fork and its exec, which closes them: this
    /// waits for that, polling with a generous deadline, rather than fail for it.
    pub(crate) fn all_closed(&self) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut byte = [0u8; 1];
        loop {
            match nix::unistd::read(&self.read, &mut byte) {
                Ok(0) => return true,
                Err(nix::errno::Errno::EAGAIN) if std::time::Instant::now() < deadline => {
                    let mut fds = [nix::poll::PollFd::new(
                        std::os::fd::AsFd::as_fd(&self.read),
                        nix::poll::PollFlags::POLLIN,
                    )];
                    let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(10u8));
                }
                _ => return false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// A SOCK_SEQPACKET pair, as every channel of appsrv's that carries descriptors.
    fn seqpacket() -> (OwnedFd, OwnedFd) {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
        socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    #[test]
    fn a_message_arrives_scattered_with_its_descriptors_owned_and_close_on_exec() {
        let (a, b) = seqpacket();
        let (probe, copies) = Probe::new(2);
        let raw: Vec<_> = copies.iter().map(AsRawFd::as_raw_fd).collect();
        send_with_fds(a.as_fd(), &[b"head", b"-tail"], &raw, false).unwrap();
        drop(copies);
        let (mut head, mut tail) = ([0u8; 4], [0u8; 16]);
        let mut bufs = [io::IoSliceMut::new(&mut head), io::IoSliceMut::new(&mut tail)];
        let (len, fds) = recv_with_fds(b.as_fd(), &mut bufs, false).unwrap();
        assert_eq!(
            (len, &head, &tail[..5], fds.len()),
            (9, b"head", &b"-tail"[..], 2)
        );
        for fd in &fds {
            let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).unwrap();
            assert_ne!(flags & libc::FD_CLOEXEC, 0, "received close-on-exec");
        }
        drop(fds);
        assert!(
            probe.all_closed(),
            "the descriptors received are owned: dropped, closed"
        );
    }

    #[test]
    fn a_truncated_message_is_an_error_and_its_descriptors_are_closed() {
        let (a, b) = seqpacket();
        let (probe, copies) = Probe::new(3);
        let raw: Vec<_> = copies.iter().map(AsRawFd::as_raw_fd).collect();
        send_with_fds(a.as_fd(), &[b"APv1 and more"], &raw, false).unwrap();
        drop(copies);
        let mut small = [0u8; 4];
        match recv_with_fds(b.as_fd(), &mut [io::IoSliceMut::new(&mut small)], false) {
            Err(RecvError::Truncated { len: 4 }) => assert_eq!(&small, b"APv1"),
            other => panic!("{other:?}"),
        }
        assert!(probe.all_closed(), "a truncated message's descriptors leaked");
    }

    #[test]
    fn end_of_file_nothing_waiting_and_an_empty_message_are_told_as_such() {
        let (a, b) = seqpacket();
        let mut buf = [0u8; 8];
        match recv_with_fds(b.as_fd(), &mut [io::IoSliceMut::new(&mut buf)], true) {
            Err(RecvError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
            other => panic!("{other:?}"),
        }
        send_with_fds(a.as_fd(), &[], &[], false).unwrap();
        let empty = recv_with_fds(b.as_fd(), &mut [io::IoSliceMut::new(&mut buf)], true).unwrap();
        assert_eq!((empty.0, empty.1.len()), (0, 0));
        drop(a);
        let eof = recv_with_fds(b.as_fd(), &mut [io::IoSliceMut::new(&mut buf)], false).unwrap();
        assert_eq!((eof.0, eof.1.len()), (0, 0));
    }

    #[repr(C)]
    struct Cell(std::sync::atomic::AtomicU32);
    // SAFETY: one atomic, valid when zero.
    unsafe impl SharedZeroed for Cell {}

    #[test]
    fn shared_memory_cannot_be_resized() {
        let (_cell, fd) = map_shared::<Cell>().unwrap();
        assert_eq!(nix::unistd::ftruncate(&fd, 0), Err(nix::errno::Errno::EPERM));
        assert_eq!(
            nix::unistd::ftruncate(&fd, 1 << 20),
            Err(nix::errno::Errno::EPERM)
        );
    }

    #[test]
    fn shared_memory_writes_in_a_child_are_seen_by_the_parent() {
        let (cell, _fd) = map_shared::<Cell>().unwrap();
        // A raw fork, because the test runner is multi-threaded (sys::fork refuses): the
        // child only does an atomic store and `_exit`, both async-signal-safe, so no lock
        // another thread held can matter.
        // SAFETY: see above; the child never returns into the test.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            cell.0.store(42, Ordering::SeqCst);
            exit_now(0);
        }
        let status = nix::sys::wait::waitpid(Pid::from_raw(pid), None).unwrap();
        assert_eq!(status, nix::sys::wait::WaitStatus::Exited(Pid::from_raw(pid), 0));
        assert_eq!(
            cell.0.load(Ordering::SeqCst),
            42,
            "MAP_SHARED: the parent sees the child's store"
        );
    }

    #[test]
    fn fork_refuses_with_threads() {
        // Keep a second thread alive across the call, whatever the test runner does.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let _ = rx.recv();
        });
        // SAFETY: the call must refuse before forking; if it did fork, the child exits at
        // once without touching anything of the test process.
        let r = unsafe { fork_child(|| exit_now(0)) };
        drop(tx);
        t.join().unwrap();
        match r {
            Err(Error::Threads { threads }) => assert!(threads >= 2),
            other => panic!("expected Error::Threads, got {other:?}"),
        }
    }
}
