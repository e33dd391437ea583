//! Run-as: an XML-RPC endpoint that runs allow-listed commands as allow-listed users, the
//! way a small `sudo` over the network would (issue #10). It shows privilege separation
//! (issue #18): the workers that read the network run as `nobody`, and a small privileged
//! helper beside each of them checks each request again and starts the command.
//!
//! One method, over HTTP POST to `/RPC2` (or `/`) with `Content-Type: text/xml`:
//!
//! ```text
//! run(token, user, command, args) → {status, signal, timed_out, stdout, stderr,
//!                                    stdout_truncated, stderr_truncated}
//! ```
//!
//! `token` is the shared secret of the policy's token file (compared in constant time),
//! `command` the *name* of an allowed command (not a path), `args` an array of strings.
//! `status` is the exit code (-1 when a signal ended the command), `signal` the signal
//! that ended it (0 if none), `timed_out` whether it ran out of time and was killed. Each
//! of stdout and stderr keeps the first 64 KiB (the rest is read and dropped, and
//! `*_truncated` says so); bytes that are not UTF-8, and control characters XML cannot
//! carry, become U+FFFD. Everything refused is an XML-RPC fault:
//!
//! | faultCode | faultString (examples) |
//! |---|---|
//! | 1 | `authentication failed: bad token; new connections from your address are refused for 1 s` (see below) |
//! | 2 | `command not allowed: "rm"` |
//! | 3 | `user not allowed for command "id": "root"` |
//! | 4 | `argument not allowed for command "id": "-Z"` (also: too many arguments) |
//! | 5 | `could not run command "id": ...` (the program could not be started; or the worker's helper is gone, did not answer in time, or could not read the request: the reason follows) |
//! | -32700 | `parse error: ...` (not well-formed XML, a DOCTYPE, not UTF-8) |
//! | -32600 | `invalid request: ...` (well-formed, but not a `<methodCall>`) |
//! | -32601 | `unknown method: "system.shutdown"` |
//! | -32602 | `invalid params: ...` (not 3 strings and an array of strings) |
//!
//! HTTP errors: another path is `404`, another method `405` (`Allow: POST`), another
//! content type `415`, a body over 64 KiB `413` (the codec's own limit, before the body is
//! read), a malformed request `400`.
//!
//! A bad token is a failed authentication (`Conn::penalize`): the connection ends after
//! the fault, and the client's address (its IPv6 `/64`) is refused new connections, by
//! every worker, for 1 s after its first failure in a row, 2 s after the second, 4 s ...,
//! at most `--penalty-max` (600 s); they are closed at once, without a reply, and the
//! fault says how long. So a brute force from one address gets a handful of guesses in its
//! first minute, then one per 10 minutes, instead of about 8,000 a second. The address is
//! forgotten once it has made no attempt for `--penalty-max` after its refusal ended.
//!
//! I/O model: blocking (the only one for it): each request runs a command and waits for it,
//! which would hold up every other client of an event-loop worker.
//!
//! Run it as root: the helpers switch to the policy's users for each command (the workers
//! themselves run as `nobody`, or `--user`), and the policy and token files must belong
//! to root. Build it as yourself, then work in a root
//! shell: you are in one already in a container; a normal user opens one with `sudo -s`
//! (prefixing each line with `sudo` does not work for the lines that redirect into a
//! root-only file).
//!
//! ```text
//! cargo build --release --example runas
//! sudo -s                                    # a normal user only; as root, skip it
//! ```
//!
//! A quick local try that writes nothing under `/etc`: the token and a copy of the sample
//! policy, pointing at that token, in a temporary directory (mode 700); the daemon's pid
//! file, log and control socket there too; one call, then everything stopped and removed.
//! `start` returns once the server is ready, so the lines can be pasted at once:
//!
//! ```text
//! D=$(mktemp -d)
//! head -c 32 /dev/urandom | base64 > "$D/token" && chmod 600 "$D/token"
//! sed "s|/etc/appsrv-runas/token|$D/token|" contrib/runas/policy.toml > "$D/policy.toml"
//! chmod 644 "$D/policy.toml"
//! B=target/release/examples/runas
//! $B start --policy "$D/policy.toml" --pid-file "$D/pid" --log-file "$D/log" \
//!     --control "$D/ctl.sock"                                   # 127.0.0.1:8070
//! TOKEN="$D/token" python3 -c 'import os, xmlrpc.client as x
//! t = open(os.environ["TOKEN"]).read().strip()
//! print(x.ServerProxy("http://127.0.0.1:8070/RPC2").run(t, "nobody", "id", ["-u", "-n"]))'
//! # {'status': 0, 'signal': 0, 'timed_out': False, 'stdout': 'nobody\n', 'stderr': '', ...}
//! $B stop --pid-file "$D/pid"; cat "$D/log"; rm -r "$D"
//! ```
//!
//! Installed for good, with the policy in `/etc/appsrv-runas` (as the sample policy's own
//! header says):
//!
//! ```text
//! install -d -m 700 /etc/appsrv-runas
//! head -c 32 /dev/urandom | base64 > /etc/appsrv-runas/token && chmod 600 /etc/appsrv-runas/token
//! install -m 644 contrib/runas/policy.toml /etc/appsrv-runas/policy.toml
//! target/release/examples/runas check --policy /etc/appsrv-runas/policy.toml
//! target/release/examples/runas --policy /etc/appsrv-runas/policy.toml   # 127.0.0.1:8070
//! # or, with each worker and its commands sandboxed (see "Under --sandbox" below):
//! target/release/examples/runas --policy /etc/appsrv-runas/policy.toml --sandbox
//! ```
//!
//! Then, from another root shell (the token is readable by root only):
//!
//! ```text
//! $ python3 -c 'import xmlrpc.client as x; t = open("/etc/appsrv-runas/token").read().strip()
//! print(x.ServerProxy("http://127.0.0.1:8070/RPC2").run(t, "nobody", "id", ["-u", "-n"]))'
//! {'status': 0, 'signal': 0, 'timed_out': False, 'stdout': 'nobody\n', 'stderr': '', ...}
//! ```
//!
//! What to observe: `id` prints the target user's uid, gid and groups (from the group
//! database, not root's); `env` shows only `HOME`, `USER`, `LOGNAME` and `PATH`; a bad
//! token, an unknown user, a command or an argument outside the policy each get a fault
//! naming what was refused, and the log says what ran, as whom, and how it ended. A
//! command that outlives its `timeout` is killed with its whole process group and reported
//! with `timed_out`; a command that exits leaving processes behind (`sh -c "daemon &"`)
//! has its process group killed too, and what left the group (`setsid`) is killed after
//! it, so nothing it started outlives the call (the log counts those). Edit the policy and `runas reload`: the new workers use it; a policy
//! with an error (a user that does not exist, a program writable by others) makes the
//! reload fail and the old policy stays in force. A bad policy at start stops `runas` with
//! the reason before it binds or detaches.
//!
//! The policy file (TOML; every key not listed here is an error):
//!
//! ```toml
//! # The shared secret: one line, at least 16 characters. The file must not be readable
//! # by group or others (chmod 600), and must belong to root (or to the user running runas).
//! token_file = "/etc/appsrv-runas/token"
//!
//! [commands.id]                  # the name a client asks for
//! program = "/usr/bin/id"        # absolute path; owned by root, not writable by group/others
//! users = ["nobody"]             # who it may run as (resolved at load: a typo is an error)
//! args = ["-u", "-g", "-G", "-n"]  # literal arguments allowed, in any order (default none)
//! words = false                  # also allow plain words (see below); default false
//! max_args = 4                   # default 16
//! timeout = 5.0                  # seconds of wall-clock time, then killed; default 10
//! max_memory_mib = 1024          # RLIMIT_AS; default 1024
//! max_file_mib = 16              # RLIMIT_FSIZE; default 16
//! max_processes = 64             # RLIMIT_NPROC (counts every process of the user); default 64
//! ```
//!
//! The CPU-time limit is the timeout's whole seconds plus one. A limit is only ever
//! lowered: one above the helper's own hard limit is set to that hard limit. RLIMIT_NPROC
//! counts *all* the processes of the user, so give the commands a dedicated user: `nobody`,
//! used here to keep the sample runnable, is shared with other daemons, and with 64 or
//! more `nobody` processes on the machine every command fails (fault 5, "too many
//! processes").
//!
//! A *word* is 1 to 256 characters from `A-Z a-z 0-9 . _ , : @ % + = -`, not starting
//! with `-` (so never an option) and not `.` or `..`; it has no `/`, no space and nothing a
//! shell would interpret (there is no shell anyway). Allow words only for commands where
//! any such word is harmless. Every argument must be one of `args` or, with `words`, a
//! word. There are no patterns: the allow-list is literal.
//!
//! How a command runs (see docs/SECURITY.md for what each step defends against): in a new
//! session and process group; with every signal disposition at its default and an empty
//! signal mask; resource limits (CPU time, address space, file size, processes, no core
//! file); then `setgroups` (the user's groups from `getgrouplist`) → `setresgid` →
//! `setresuid`, checked (all three ids, and `setuid(0)` must fail); a parent-death signal;
//! the user's home as working directory (or `/`); umask 022; every descriptor but 0, 1 and
//! 2 closed on exec; stdin from `/dev/null`; an environment of `HOME`, `USER`, `LOGNAME`
//! and `PATH=/usr/bin:/bin` only; `execve` of the program with the arguments as argv, no
//! shell. The helper reads stdout and stderr with `poll` until the command exits (it learns
//! so with `waitid(WNOWAIT)`, without reaping it) or the timeout passes; then it kills the
//! command's whole process group with SIGKILL, reads what is left in the pipes until they
//! close (for at most 2 s), and only then reaps the command, so no zombie is left. Until
//! that reap, the exited command keeps its pid, the group's id, from being reused, so the
//! kill reaches only its own group; the rest of the group, orphaned into the helper (a
//! child subreaper), is reaped too. A process that left the group (`setsid`, `setpgid`) is
//! then the helper's child, and is killed and reaped before the answer
//! (`appsrv::privileged::kill_leftovers`; the log says how many); if it held the output
//! open, the call answers 2 s after the command ended, with what was read, and the log
//! warns. A process that left the group *and* whose parent is still alive when the
//! command ends is not yet the helper's child: it is killed with that parent, which is.
//!
//! **Under `--sandbox`** (appsrv's sandbox: Landlock for files, a seccomp allow-list for
//! system calls), the workers get appsrv's default profile (no exec, no fork, no change
//! of identity, no new socket, no file: they parse, check and call their helper), and
//! each helper a profile of its own (`Server::privileged_sandbox`), built from the policy
//! loaded at start (`sandbox_profile`), which every command it starts inherits:
//!
//! - **execute**: exactly the programs of the policy, and what the kernel itself opens to
//!   run each of them: its ELF loader (`PT_INTERP`, such as `/lib64/ld-linux-x86-64.so.2`)
//!   or, for a script, its `#!` interpreter;
//! - **read**: the shared libraries (`/lib`, `/lib64`, `/usr/lib`, `/usr/lib64`, those that
//!   exist) and `/etc/ld.so.cache`, for dynamically linked programs; `/etc/nsswitch.conf`,
//!   `/etc/passwd` and `/etc/group`, for the commands' name lookups (`id -n`);
//!   `/etc/localtime`, the time zone (`date`); `/dev/null`, the commands' stdin; and
//!   (appsrv's rule) the helper's own `/proc/self/task`, where it finds what a command
//!   left behind. The helper itself reads no other file: the policy and the token are
//!   read, and the users resolved, in the master (at start and on `reload`);
//! - **write**: nothing;
//! - **system calls**: appsrv's default list, plus process creation (`fork`, `execve`,
//!   waiting, and the changes of user, groups, limits and directory the child makes before
//!   `execve`; with it `socketpair`, which std's `Command::spawn` uses to learn that an
//!   `execve` failed).
//!
//! So a command can start only the programs of the policy, even when it is a program that
//! starts others (`env`, a shell, `find -exec`): any other `execve` fails with "Permission
//! denied" (`env` exits with 126). It cannot open a socket, write a file, or read outside
//! those paths (libselinux's probes and NSS lookups through nscd or systemd fail quietly
//! and fall back to the files); a command that needs more gets it from the command line,
//! `--sandbox-read /proc` for `cat /proc/self/status`, `--sandbox-write DIR` (appsrv adds
//! these to the helpers' profile as well as the workers'). The sandbox
//! implies no-new-privs: a setuid program in the policy runs without its privilege. On a
//! kernel without Landlock, only the system-call filter applies (appsrv logs a warning).
//!
//! The profile is fixed when the helpers' sandbox is set up, at start: a program that
//! `reload` adds to the policy cannot be executed by sandboxed helpers. The reload logs a
//! warning naming it, and a call gets fault 5 (`Permission denied`, with the advice to
//! restart runas); a restart builds the profile from the new policy. Limits: the
//! allow-list is one for all the commands, interpreters included (an allowed `#!/bin/sh`
//! script lets `env /bin/sh` run, where the policy allows that argument); a script that
//! starts its interpreter through `#!/usr/bin/env NAME` fails unless NAME is a program of
//! the policy too (write the interpreter's path); and Landlock checks `execve`, not the
//! mapping of code, so a command that can be made to run the loader on a file (`env
//! /lib64/ld-linux-x86-64.so.2 /usr/lib/...`) runs any program it can read beneath the
//! library directories: never allow the loader as an argument.
//!
//! **Trust boundaries** (issue #18):
//!
//! ```text
//! network ──HTTP──▶ worker ──Request::Run{token, user, command, args}──▶ helper ──fork, setuid──▶ command
//!                   nobody (or --user), no capability,         uid 0, CAP_SETUID, CAP_SETGID,   the target user,
//!                   default sandbox: parses, checks            CAP_KILL only; no socket but     the helper's
//!                                                              its channel; checks again        sandbox, no capability
//! ```
//!
//! - The **worker** (one of `--workers`) holds the listener and the client's connection,
//!   parses HTTP and XML-RPC and checks the call against the policy, then asks its helper
//!   for a narrow typed request: the policy's command *name*, the user's name, the
//!   arguments and the token, never a path or a command line. It cannot start a process,
//!   change its identity or signal another user's process; under `--sandbox` it executes
//!   nothing and opens no file.
//! - The **helper** (one per worker, forked by it before it dropped root) reads nothing
//!   from the network: only its worker's requests. It checks each again against its own
//!   copy of the policy (the master's, inherited through the forks: a `reload` makes new
//!   workers and new helpers), so a worker made to ask for anything gets the policy's fault
//!   (`--unchecked-workers`, hidden, makes the workers skip their check: for tests that
//!   show it). It keeps uid 0 for nothing but `CAP_SETUID`, `CAP_SETGID` and `CAP_KILL`
//!   (see `CAPABILITIES` in [`RunHelper`]); every other capability is out of its bounding set.
//! - The **command** runs as its user with the helper's sandbox, and no capability.
//!
//! If a helper dies, its worker's call gets fault 5 (`the privileged helper is gone`), the
//! worker stops after that connection, and the master replaces both. runas must start as
//! root (it says so at start otherwise); `--user` chooses the workers' user.
//!
//! **The code**: this file holds the command line and `main` (the policy loaded in the
//! master, the helpers' sandbox profile, `reload` and `check`); the rest is in `runas/`,
//! one concern a file, each with a header that says what it owns:
//!
//! - `runas/policy.rs`: the policy file, its checks at load, and its answer to a call;
//! - `runas/xmlrpc.rs`: the XML-RPC reader and writer, and the faults;
//! - `runas/worker.rs`: a worker's handler (HTTP, XML-RPC, the policy's check, the call to
//!   its helper);
//! - `runas/protocol.rs`: the messages between a worker and its helper;
//! - `runas/helper.rs`: the privileged helper (the check again, and the command as its
//!   user);
//! - `runas/exec.rs`: running a command (the child's set-up before `execve`, the limits,
//!   the output, the kill of its process group);
//! - `runas/sandbox.rs`: the helpers' sandbox profile under `--sandbox`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::rc::Rc;

use nix::unistd::Uid;

#[path = "runas/exec.rs"]
mod exec;
#[path = "runas/helper.rs"]
mod helper;
#[path = "runas/policy.rs"]
mod policy;
#[path = "runas/protocol.rs"]
mod protocol;
#[path = "runas/sandbox.rs"]
mod sandbox;
#[path = "runas/worker.rs"]
mod worker;
#[path = "runas/xmlrpc.rs"]
mod xmlrpc;

use helper::RunHelper;
use policy::Policy;
use sandbox::sandbox_profile;
use worker::RunAs;

#[derive(clap::Args, Debug)]
struct Args {
    /// The policy file (TOML): the token file, and each allowed command with its program,
    /// arguments, users and timeout. Required by run, start and check.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// For tests only, hidden from the help: the workers skip their own check of the
    /// policy and forward every `run` call to their helper as it came, so that a test can
    /// show that the helper refuses what the policy forbids even when a worker (say, a
    /// compromised one) asks for it. Never use it in production: it only costs a round
    /// trip per refused call, but it is not how runas is meant to run.
    #[arg(long, hide = true)]
    unchecked_workers: bool,
}

/// Whether the command line runs the server (`run`, `start`, or no subcommand) or checks
/// it, as opposed to a control subcommand (`stop`, `reload`, ...) that needs no policy.
/// appsrv does not tell the application which subcommand was given, so this follows its
/// rule: the first argument names the subcommand, `-t` is `check`, anything else is `run`.
fn subcommand() -> String {
    match std::env::args_os().nth(1).as_deref().and_then(|a| a.to_str()) {
        Some("-t") => "check".into(),
        Some(
            s @ ("start" | "stop" | "check" | "reload" | "upgrade" | "status" | "metrics" | "workers"
            | "help"),
        ) => s.into(),
        _ => "run".into(),
    }
}

/// Why runas refuses to start other than as root (and why a helper that is not root
/// refuses to start).
const NOT_ROOT: &str = "runas must start as root: each worker's privileged helper stays root (with \
     CAP_SETUID, CAP_SETGID and CAP_KILL only) to run the commands as their users; the workers \
     themselves run as --user (default nobody)";

fn main() {
    serve().unwrap_or_else(|e| e.exit());
}

fn serve() -> appsrv::Result<()> {
    // No allow_root_workers: the workers run as --user, or nobody; only their helpers keep
    // root (see the module documentation).
    let mut server = appsrv::server!("runas")
        .about("Runs allow-listed commands as allow-listed users over XML-RPC (see the policy file)")
        .listen("127.0.0.1:8070");
    let args: Args = server.args();
    let sub = subcommand();
    let needs_policy = matches!(sub.as_str(), "run" | "start" | "check");
    let path = match (args.policy, needs_policy) {
        (Some(p), _) => std::path::absolute(&p).unwrap_or(p),
        (None, true) => return Err(appsrv::Error::Config("--policy FILE is required".into())),
        // A control subcommand: the policy is never used.
        (None, false) => PathBuf::new(),
    };
    // Loaded here, in the master, before anything is bound or the daemon detaches: a bad
    // policy stops `run` and `start` with the reason on the terminal. `check` loads it in
    // its hook, to report it as a check does.
    let empty = || Policy {
        token: Vec::new(),
        commands: BTreeMap::new(),
    };
    let initial = if sub == "run" || sub == "start" {
        let policy = Policy::load(&path).map_err(appsrv::Error::Config)?;
        // Said once, before binding, rather than by each helper as it fails to start.
        if !Uid::effective().is_root() {
            return Err(appsrv::Error::Config(NOT_ROOT.into()));
        }
        policy
    } else {
        empty()
    };
    // The helper's sandbox profile (used with --sandbox only), from the policy at start:
    // it is fixed for the server's life, and a reload cannot extend it. The workers keep
    // appsrv's default profile: no exec, no fork, no change of identity.
    if sub == "run" || sub == "start" {
        server = server.privileged_sandbox(sandbox_profile(&initial).map_err(appsrv::Error::Config)?);
    }
    let at_start: Rc<BTreeSet<PathBuf>> =
        Rc::new(initial.commands.values().map(|r| r.program.clone()).collect());
    let current = Rc::new(std::cell::RefCell::new(Rc::new(initial)));
    let (for_reload, for_check) = (path.clone(), path.clone());
    let reloaded = Rc::clone(&current);
    let for_helper = Rc::clone(&current);
    let known = Rc::clone(&at_start);
    let unchecked = args.unchecked_workers;
    server
        .privileged(move || {
            // The helper's own copy of the policy: the master's (at start, or from the last
            // reload), inherited through the forks; after a reload the workers and their
            // helpers are new.
            if !Uid::effective().is_root() {
                return Err(NOT_ROOT.into());
            }
            Ok(RunHelper {
                policy: Rc::clone(&*for_helper.borrow()),
                at_start: Rc::clone(&at_start),
            })
        })
        .on_reload(move || {
            // A bad policy fails the reload; the workers keep the one they have.
            let policy = Policy::load(&for_reload)?;
            tracing::info!(
                "policy {} reloaded: {} command(s) allowed",
                for_reload.display(),
                policy.commands.len()
            );
            let added: Vec<String> = policy
                .commands
                .values()
                .filter(|r| !known.contains(&r.program))
                .map(|r| r.program.display().to_string())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            if !added.is_empty() {
                // appsrv does not tell the application whether --sandbox is on: say it
                // in case it is.
                tracing::warn!(
                    "policy {}: program(s) not in the policy at start: {}; with --sandbox, \
                     the helpers cannot execute them until runas is restarted",
                    for_reload.display(),
                    added.join(", ")
                );
            }
            *reloaded.borrow_mut() = Rc::new(policy);
            Ok(())
        })
        .on_check(move || {
            // The sandbox profile too: it resolves each program's loader or interpreter.
            sandbox_profile(&Policy::load(&for_check)?)?;
            Ok(())
        })
        .run_requests(move || {
            if unchecked {
                tracing::warn!("--unchecked-workers: this worker does not check the policy (for tests only)");
            }
            Ok(RunAs {
                policy: Rc::clone(&*current.borrow()),
                unchecked,
            })
        })
}
