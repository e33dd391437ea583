//! The `runas` example's sandbox profile, for `--sandbox`: the profile of the helpers, and
//! so of every command they start (`Server::privileged_sandbox`), built from the policy
//! loaded at start: execute exactly the policy's programs and what the kernel opens to run
//! them (an ELF program's loader, a script's `#!` interpreter, found by reading the file:
//! `exec_interpreter`), read the libraries and the few files the commands need
//! (`SANDBOX_READ`), write nothing.
//!
//! It is a module of its own because it is built once, in the master, from the policy, and
//! fixed for the server's life (a `reload` cannot extend it): what it allows and why is
//! in the header of `runas.rs` ("Under --sandbox") and in docs/SECURITY.md.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};

use crate::policy::Policy;

/// What every command needs to read, on top of its program and the program's interpreter,
/// when present on this system (a missing path would make every worker fail to start).
/// Each was found by running the commands under the sandbox with `strace -f`.
const SANDBOX_READ: &[&str] = &[
    // The dynamic loader's cache, which maps library names to files (without it the
    // loader only searches its built-in directories, and misses /usr/local/lib and the
    // like).
    "/etc/ld.so.cache",
    // The shared libraries of dynamically linked programs (and the NSS modules that name
    // lookups load), for merged-/usr and split layouts alike; the same directory reached
    // through a symbolic link (/lib -> usr/lib) is given once.
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
    // Name lookups by the commands (`id -n`, `id -G -n`, `whoami`, `ls -l`): which
    // databases to use, and the files database. The helper itself resolves no name (the
    // users of the policy are resolved in the master, when it is loaded).
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    // The local time zone, for commands that show times (`date`, `ls -l`): without it
    // they print UTC, silently. The file it names at start (usually a link into
    // /usr/share/zoneinfo).
    "/etc/localtime",
    // The command's stdin: the helper opens it (read only) before the fork.
    "/dev/null",
];

/// The profile of the helpers (and so of the commands) under `--sandbox`, from the policy loaded at start (see the
/// example's documentation, in the header of `runas.rs`).
pub(crate) fn sandbox_profile(policy: &Policy) -> Result<appsrv::Sandbox, String> {
    let mut profile = appsrv::Sandbox::new()
        // fork, execve, wait, and what the child does before execve (ChildSetup::apply):
        // setsid, setrlimit, setgroups/setresgid/setresuid, chdir, umask; kill for the
        // process group (at the exit and the timeout), pidfd_open to wait for the exit.
        // (with socketpair: std's Command::spawn, on the fork path that pre_exec takes,
        // reports a failed execve to the parent through an AF_UNIX socket pair).
        .allow_process_creation();
    // Execute: each program, and what the kernel itself opens to execute it (a script's
    // `#!` interpreter, an ELF program's loader), which needs the same right.
    let mut execute = BTreeSet::new();
    for rule in policy.commands.values() {
        let mut path = rule.program.clone();
        // The kernel follows at most four levels of interpreters.
        for _ in 0..5 {
            let next = exec_interpreter(&path)
                .map_err(|e| format!("--sandbox: finding the interpreter of {}: {e}", path.display()))?;
            execute.insert(path);
            match next {
                Some(interp) if interp.is_absolute() && interp.exists() => path = interp,
                _ => break,
            }
        }
    }
    for path in &execute {
        profile = profile.execute(path);
    }
    let mut read = BTreeSet::new();
    for path in SANDBOX_READ {
        if let Ok(real) = std::fs::canonicalize(path) {
            read.insert(real);
        }
    }
    for path in &read {
        profile = profile.read(path);
    }
    Ok(profile)
}

/// The file the kernel opens, besides `program`, to execute it: the interpreter of a `#!`
/// script, or the loader (`PT_INTERP`) of a dynamically linked ELF program. `None` for a
/// statically linked program, and for anything else (which `execve` refuses anyway).
fn exec_interpreter(program: &Path) -> io::Result<Option<PathBuf>> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(program)?;
    let mut head = [0u8; 256];
    let mut len = 0;
    while len < head.len() {
        match file.read_at(&mut head[len..], len as u64)? {
            0 => break,
            n => len += n,
        }
    }
    let head = &head[..len];
    if let Some(line) = head.strip_prefix(b"#!") {
        // The kernel's rule: the first word of the line, after optional blanks.
        let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
        let word = line.split(|&b| b == b' ' || b == b'\t').find(|w| !w.is_empty());
        return Ok(word.map(|w| PathBuf::from(std::ffi::OsStr::from_bytes(w))));
    }
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "a malformed ELF header");
    if !head.starts_with(b"\x7fELF") || head.len() < 64 {
        return Ok(None);
    }
    let is64 = head[4] == 2;
    let little = head[5] == 1;
    let u16_at = |b: &[u8], at: usize| {
        let bytes = [b[at], b[at + 1]];
        if little {
            u16::from_le_bytes(bytes)
        } else {
            u16::from_be_bytes(bytes)
        }
    };
    let u32_at = |b: &[u8], at: usize| {
        let bytes = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        if little {
            u32::from_le_bytes(bytes)
        } else {
            u32::from_be_bytes(bytes)
        }
    };
    let u64_at = |b: &[u8], at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&b[at..at + 8]);
        if little {
            u64::from_le_bytes(bytes)
        } else {
            u64::from_be_bytes(bytes)
        }
    };
    // e_phoff, e_phentsize, e_phnum; then in each program header p_type, p_offset, p_filesz.
    let (phoff, phentsize, phnum, min_entry) = match is64 {
        true => (u64_at(head, 0x20), u16_at(head, 0x36), u16_at(head, 0x38), 56),
        false => (
            u64::from(u32_at(head, 0x1c)),
            u16_at(head, 0x2a),
            u16_at(head, 0x2c),
            32,
        ),
    };
    if usize::from(phentsize) < min_entry {
        return Err(bad());
    }
    let mut header = vec![0u8; phentsize.into()];
    for i in 0..u64::from(phnum) {
        file.read_exact_at(&mut header, phoff + i * u64::from(phentsize))?;
        const PT_INTERP: u32 = 3;
        if u32_at(&header, 0) != PT_INTERP {
            continue;
        }
        let (offset, size) = match is64 {
            true => (u64_at(&header, 8), u64_at(&header, 32)),
            false => (u64::from(u32_at(&header, 4)), u64::from(u32_at(&header, 16))),
        };
        if size == 0 || size > 4096 {
            return Err(bad());
        }
        let mut name = vec![0u8; size as usize];
        file.read_exact_at(&mut name, offset)?;
        let name = name.split(|&b| b == 0).next().unwrap_or_default();
        return Ok(Some(PathBuf::from(std::ffi::OsStr::from_bytes(name))));
    }
    Ok(None)
}
