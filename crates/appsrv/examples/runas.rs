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
//!   (see [`RunHelper::CAPABILITIES`]); every other capability is out of its bounding set.
//! - The **command** runs as its user with the helper's sandbox, and no capability.
//!
//! If a helper dies, its worker's call gets fault 5 (`the privileged helper is gone`), the
//! worker stops after that connection, and the master replaces both. runas must start as
//! root (it says so at start otherwise); `--user` chooses the workers' user.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use appsrv::codec::{Http, HttpRequest, HttpResponse};
use appsrv::privileged::{Caller, Capability, Privileged};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::resource::Resource;
use nix::sys::signal::{self, SigSet, Signal};
use nix::unistd::{Gid, Pid, Uid, User};
use quick_xml::events::Event;
use serde::{Deserialize, Serialize};

/// What is kept of each of stdout and stderr.
const OUTPUT_CAP: usize = 64 * 1024;
/// The largest request body (the HTTP codec answers 413 above it).
const MAX_BODY: usize = 64 * 1024;
/// The most XML elements and texts a request may have.
const MAX_TOKENS: usize = 4096;
/// The deepest nesting of XML-RPC values.
const MAX_DEPTH: usize = 8;
/// The most arguments a policy may allow a command.
const MAX_ARGS_LIMIT: usize = 256;
/// The longest word argument.
const MAX_WORD_LEN: usize = 256;
/// The longest timeout a policy may give a command, in seconds. Keep the timeouts below
/// `--request-timeout` (60 s by default): past it, appsrv kills the worker (and the
/// command with it, through its parent-death signal) and the client gets no answer.
const MAX_TIMEOUT_SECS: f64 = 3600.0;
/// The shortest token accepted.
const MIN_TOKEN_LEN: usize = 16;

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

// ---------------------------------------------------------------------------------------
// The policy
// ---------------------------------------------------------------------------------------

/// The policy file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    token_file: PathBuf,
    #[serde(default)]
    commands: BTreeMap<String, CommandFile>,
}

/// One `[commands.NAME]` table as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandFile {
    program: PathBuf,
    users: Vec<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    words: bool,
    #[serde(default = "default_max_args")]
    max_args: usize,
    #[serde(default = "default_timeout")]
    timeout: f64,
    #[serde(default = "default_max_memory_mib")]
    max_memory_mib: u64,
    #[serde(default = "default_max_file_mib")]
    max_file_mib: u64,
    #[serde(default = "default_max_processes")]
    max_processes: u64,
}

fn default_max_args() -> usize {
    16
}
fn default_timeout() -> f64 {
    10.0
}
fn default_max_memory_mib() -> u64 {
    1024
}
fn default_max_file_mib() -> u64 {
    16
}
fn default_max_processes() -> u64 {
    64
}

/// The policy, checked and resolved: users are uids with their groups.
struct Policy {
    token: Vec<u8>,
    commands: BTreeMap<String, Rule>,
}

/// An allowed command.
struct Rule {
    program: PathBuf,
    users: BTreeMap<String, Rc<Target>>,
    args: BTreeSet<String>,
    words: bool,
    max_args: usize,
    timeout: Duration,
    limits: Limits,
}

#[derive(Clone, Copy)]
struct Limits {
    cpu_secs: u64,
    memory_bytes: u64,
    file_bytes: u64,
    processes: u64,
}

/// A user commands may run as, resolved when the policy is loaded.
struct Target {
    name: String,
    uid: Uid,
    gid: Gid,
    /// The supplementary groups, as `initgroups` would set them.
    groups: Vec<Gid>,
    home: PathBuf,
}

impl Policy {
    /// Reads, checks and resolves the policy at `path`. Every error names the file and,
    /// where it applies, the command.
    fn load(path: &Path) -> Result<Policy, String> {
        let fail = |msg: String| format!("policy {}: {msg}", path.display());
        check_owner_and_mode(path, 0o022, "writable by group or others").map_err(fail)?;
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let file: PolicyFile =
            toml::from_str(&text).map_err(|e| fail(e.to_string().trim_end().to_owned()))?;
        let token = load_token(&file.token_file)
            .map_err(|e| fail(format!("token_file {}: {e}", file.token_file.display())))?;
        let mut users: BTreeMap<String, Rc<Target>> = BTreeMap::new();
        let mut commands = BTreeMap::new();
        for (name, cmd) in file.commands {
            let rule =
                Rule::resolve(&name, cmd, &mut users).map_err(|e| fail(format!("command {name:?}: {e}")))?;
            commands.insert(name, rule);
        }
        Ok(Policy { token, commands })
    }
}

impl Policy {
    /// The policy's answer to `run(token, user, command, args)`: the rule and the user,
    /// or the fault that names what is refused. The worker checks with it, and its helper
    /// again.
    fn check<'p>(
        &'p self,
        token: &str,
        user: &str,
        command: &str,
        args: &[&str],
    ) -> Result<(&'p Rule, &'p Target), Fault> {
        // The token first: a client without it learns nothing about the policy.
        if !token_matches(token.as_bytes(), &self.token) {
            return Err(Fault::new(FAULT_AUTH, "authentication failed: bad token"));
        }
        let Some(rule) = self.commands.get(command) else {
            let shown: String = command.chars().take(64).collect();
            return Err(Fault::new(
                FAULT_COMMAND,
                format!("command not allowed: {shown:?}"),
            ));
        };
        let Some(target) = rule.users.get(user) else {
            let shown: String = user.chars().take(64).collect();
            return Err(Fault::new(
                FAULT_USER,
                format!("user not allowed for command {command:?}: {shown:?}"),
            ));
        };
        rule.check_args(command, args)
            .map_err(|e| Fault::new(FAULT_ARGUMENT, e))?;
        Ok((rule, target))
    }
}

impl Rule {
    fn resolve(
        name: &str,
        cmd: CommandFile,
        users: &mut BTreeMap<String, Rc<Target>>,
    ) -> Result<Rule, String> {
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !name_ok {
            return Err("a command name is 1 to 64 letters, digits, '.', '_' or '-'".into());
        }
        if !cmd.program.is_absolute() {
            return Err(format!(
                "program {}: must be an absolute path",
                cmd.program.display()
            ));
        }
        let meta =
            std::fs::metadata(&cmd.program).map_err(|e| format!("program {}: {e}", cmd.program.display()))?;
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            return Err(format!(
                "program {}: not an executable file",
                cmd.program.display()
            ));
        }
        if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
            // Anyone who can replace the program runs code as every user of this command.
            return Err(format!(
                "program {}: must belong to root and not be writable by group or others",
                cmd.program.display()
            ));
        }
        if cmd.users.is_empty() {
            return Err("users: at least one user is needed".into());
        }
        let mut targets = BTreeMap::new();
        for user in &cmd.users {
            let target = match users.get(user) {
                Some(t) => Rc::clone(t),
                None => {
                    let t = Rc::new(resolve_user(user).map_err(|e| format!("user {user:?}: {e}"))?);
                    users.insert(user.clone(), Rc::clone(&t));
                    t
                }
            };
            targets.insert(user.clone(), target);
        }
        if let Some(arg) = cmd.args.iter().find(|a| a.contains('\0')) {
            return Err(format!("args: {arg:?} contains a NUL character"));
        }
        if cmd.max_args > MAX_ARGS_LIMIT {
            return Err(format!("max_args {}: at most {MAX_ARGS_LIMIT}", cmd.max_args));
        }
        if !(cmd.timeout.is_finite() && cmd.timeout > 0.0 && cmd.timeout <= MAX_TIMEOUT_SECS) {
            return Err(format!(
                "timeout {}: expected more than 0 and at most {MAX_TIMEOUT_SECS} seconds",
                cmd.timeout
            ));
        }
        for (key, value) in [
            ("max_memory_mib", cmd.max_memory_mib),
            ("max_file_mib", cmd.max_file_mib),
            ("max_processes", cmd.max_processes),
        ] {
            if value == 0 || value > 1 << 20 {
                return Err(format!("{key} {value}: expected 1 to {}", 1u64 << 20));
            }
        }
        let timeout = Duration::from_secs_f64(cmd.timeout);
        Ok(Rule {
            program: cmd.program,
            users: targets,
            args: cmd.args.into_iter().collect(),
            words: cmd.words,
            max_args: cmd.max_args,
            timeout,
            limits: Limits {
                // CPU time cannot outrun wall-clock time, so the timeout's whole seconds
                // plus one: it bounds what the command leaves behind after it is killed
                // (a process that left its group and escaped the kill).
                cpu_secs: timeout.as_secs() + 1,
                memory_bytes: cmd.max_memory_mib << 20,
                file_bytes: cmd.max_file_mib << 20,
                processes: cmd.max_processes,
            },
        })
    }

    /// Whether `args` are allowed: `Err` is the fault string.
    fn check_args(&self, command: &str, args: &[&str]) -> Result<(), String> {
        if args.len() > self.max_args {
            return Err(format!(
                "argument not allowed for command {command:?}: too many arguments ({}, at most {})",
                args.len(),
                self.max_args
            ));
        }
        for arg in args {
            if !(self.args.contains(*arg) || self.words && is_word(arg)) {
                let shown: String = arg.chars().take(64).collect();
                return Err(format!("argument not allowed for command {command:?}: {shown:?}"));
            }
        }
        Ok(())
    }
}

/// A plain word: see the module documentation.
fn is_word(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_WORD_LEN
        && !s.starts_with('-')
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._,:@%+=-".contains(&b))
}

fn resolve_user(name: &str) -> Result<Target, String> {
    let user = User::from_name(name)
        .map_err(|e| format!("lookup failed: {}", e.desc()))?
        .ok_or("no such user")?;
    if user.uid.is_root() {
        return Err("running commands as root is not allowed".into());
    }
    if user.gid.as_raw() == 0 {
        return Err("a user whose primary group is root (gid 0) is not allowed".into());
    }
    let cname = CString::new(name).map_err(|_| "the name contains a NUL character")?;
    let groups = nix::unistd::getgrouplist(&cname, user.gid).map_err(|e| format!("groups: {}", e.desc()))?;
    Ok(Target {
        name: user.name,
        uid: user.uid,
        gid: user.gid,
        groups,
        home: user.dir,
    })
}

/// Fails if `path` is not a regular file that belongs to root or to this process's user,
/// or if its mode has any bit of `forbidden` (`what` says which in the message).
fn check_owner_and_mode(path: &Path, forbidden: u32, what: &str) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let euid = Uid::effective().as_raw();
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(format!(
            "must belong to root or to uid {euid}, not uid {}",
            meta.uid()
        ));
    }
    if meta.mode() & forbidden != 0 {
        return Err(format!("mode {:03o} is {what}", meta.mode() & 0o777));
    }
    Ok(())
}

fn load_token(path: &Path) -> Result<Vec<u8>, String> {
    if !path.is_absolute() {
        return Err("must be an absolute path".into());
    }
    check_owner_and_mode(path, 0o077, "readable by group or others (chmod 600)")?;
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let token = bytes.trim_ascii();
    if token.len() < MIN_TOKEN_LEN {
        return Err(format!("the token is shorter than {MIN_TOKEN_LEN} characters"));
    }
    Ok(token.to_vec())
}

/// Compares a presented token with the expected one in time that depends only on the
/// expected token's length, not on where they differ (nor on the presented length).
fn token_matches(presented: &[u8], expected: &[u8]) -> bool {
    let mut diff = (presented.len() != expected.len()) as u8;
    for (i, e) in expected.iter().enumerate() {
        diff |= e ^ presented.get(i).copied().unwrap_or(0);
    }
    std::hint::black_box(diff) == 0
}

// ---------------------------------------------------------------------------------------
// XML-RPC
// ---------------------------------------------------------------------------------------

/// An XML-RPC value. Types the method never takes are kept by name only, for the message.
enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
    Array(Vec<Value>),
    Struct(Vec<(String, Value)>),
    Other(&'static str),
}

impl Value {
    fn type_name(&self) -> &'static str {
        match self {
            Value::Str(_) => "string",
            Value::Int(_) => "int",
            Value::Bool(_) => "boolean",
            Value::Array(_) => "array",
            Value::Struct(_) => "struct",
            Value::Other(t) => t,
        }
    }
}

/// A fault: XML-RPC's error reply (also the helper's refusal, as it travels back).
#[derive(Serialize, Deserialize)]
struct Fault {
    code: i32,
    message: String,
}

impl Fault {
    fn new(code: i32, message: impl Into<String>) -> Fault {
        Fault {
            code,
            message: message.into(),
        }
    }
}

const FAULT_AUTH: i32 = 1;
const FAULT_COMMAND: i32 = 2;
const FAULT_USER: i32 = 3;
const FAULT_ARGUMENT: i32 = 4;
const FAULT_EXEC: i32 = 5;
const FAULT_PARSE: i32 = -32700;
const FAULT_REQUEST: i32 = -32600;
const FAULT_METHOD: i32 = -32601;
const FAULT_PARAMS: i32 = -32602;

/// The XML of a request, flattened: elements become `Open`/`Close` (an empty element
/// both), text is unescaped and merged.
#[derive(PartialEq)]
enum Tok {
    Open(String),
    Close(String),
    Text(String),
}

fn tokenize(xml: &str) -> Result<Vec<Tok>, String> {
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut toks = Vec::new();
    fn text(toks: &mut Vec<Tok>, s: &str) {
        match toks.last_mut() {
            Some(Tok::Text(t)) => t.push_str(s),
            _ => toks.push(Tok::Text(s.to_owned())),
        }
    }
    let name =
        |n: &[u8]| String::from_utf8(n.to_vec()).map_err(|_| "an element name is not UTF-8".to_owned());
    loop {
        let event = reader.read_event().map_err(|e| {
            format!(
                "not well-formed XML (near byte {}): {e}",
                reader.buffer_position()
            )
        })?;
        match event {
            Event::Start(e) => toks.push(Tok::Open(name(e.name().as_ref())?)),
            Event::Empty(e) => {
                let n = name(e.name().as_ref())?;
                toks.push(Tok::Open(n.clone()));
                toks.push(Tok::Close(n));
            }
            Event::End(e) => toks.push(Tok::Close(name(e.name().as_ref())?)),
            Event::Text(t) => text(&mut toks, &t.xml10_content().map_err(|e| e.to_string())?),
            Event::CData(t) => text(&mut toks, &t.xml10_content().map_err(|e| e.to_string())?),
            Event::GeneralRef(r) => {
                let c = match r.resolve_char_ref().map_err(|e| e.to_string())? {
                    Some(c) => c.to_string(),
                    None => {
                        let entity = r.decode().map_err(|e| e.to_string())?;
                        quick_xml::escape::resolve_xml_entity(&entity)
                            .ok_or_else(|| format!("unknown entity &{entity};"))?
                            .to_owned()
                    }
                };
                text(&mut toks, &c);
            }
            Event::Decl(d) => {
                if let Some(Ok(enc)) = d.encoding() {
                    if !enc.eq_ignore_ascii_case(b"utf-8") && !enc.eq_ignore_ascii_case(b"us-ascii") {
                        return Err(format!(
                            "encoding {:?}: only UTF-8 is accepted",
                            String::from_utf8_lossy(&enc)
                        ));
                    }
                }
            }
            // No DTD at all: no entity definitions, no expansion bombs, no external files.
            Event::DocType(_) => return Err("a DOCTYPE is not allowed".into()),
            Event::Comment(_) | Event::PI(_) => {}
            Event::Eof => break,
        }
        if toks.len() > MAX_TOKENS {
            return Err(format!("more than {MAX_TOKENS} elements"));
        }
    }
    Ok(toks)
}

/// A recursive-descent reader of the flattened request.
struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    /// Skips a text made only of white space (between elements).
    fn skip_space(&mut self) {
        if let Some(Tok::Text(t)) = self.peek() {
            if t.trim().is_empty() {
                self.pos += 1;
            }
        }
    }

    fn open(&mut self, name: &str) -> Result<(), String> {
        self.skip_space();
        match self.peek() {
            Some(Tok::Open(n)) if n == name => {
                self.pos += 1;
                Ok(())
            }
            other => Err(format!("expected <{name}>, found {}", describe(other))),
        }
    }

    fn close(&mut self, name: &str) -> Result<(), String> {
        self.skip_space();
        match self.peek() {
            Some(Tok::Close(n)) if n == name => {
                self.pos += 1;
                Ok(())
            }
            other => Err(format!("expected </{name}>, found {}", describe(other))),
        }
    }

    fn at_close(&mut self, name: &str) -> bool {
        self.skip_space();
        matches!(self.peek(), Some(Tok::Close(n)) if n == name)
    }

    /// The text up to `</name>` (empty if there is none).
    fn text(&mut self, name: &str) -> Result<String, String> {
        let s = match self.peek() {
            Some(Tok::Text(t)) => {
                let t = t.clone();
                self.pos += 1;
                t
            }
            _ => String::new(),
        };
        self.close(name)?;
        Ok(s)
    }

    /// `<methodCall>`: the method name and the parameters.
    fn call(&mut self) -> Result<(String, Vec<Value>), String> {
        self.open("methodCall")?;
        self.open("methodName")?;
        let method = self.text("methodName")?.trim().to_owned();
        let mut params = Vec::new();
        self.skip_space();
        if let Some(Tok::Open(n)) = self.peek() {
            if n == "params" {
                self.open("params")?;
                while !self.at_close("params") {
                    self.open("param")?;
                    params.push(self.value(0)?);
                    self.close("param")?;
                }
                self.close("params")?;
            }
        }
        self.close("methodCall")?;
        self.skip_space();
        if self.pos != self.toks.len() {
            return Err(format!(
                "unexpected {} after </methodCall>",
                describe(self.peek())
            ));
        }
        Ok((method, params))
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(format!("values nested deeper than {MAX_DEPTH}"));
        }
        self.open("value")?;
        // A value without a type element is a string, white space included.
        if let Some(Tok::Text(t)) = self.peek() {
            if matches!(self.toks.get(self.pos + 1), Some(Tok::Close(n)) if n == "value") {
                let s = t.clone();
                self.pos += 2;
                return Ok(Value::Str(s));
            }
        }
        if let Some(Tok::Close(n)) = self.peek() {
            if n == "value" {
                self.pos += 1;
                return Ok(Value::Str(String::new()));
            }
        }
        self.skip_space();
        let kind = match self.peek() {
            Some(Tok::Open(n)) => n.clone(),
            other => return Err(format!("expected a value type, found {}", describe(other))),
        };
        self.pos += 1;
        let value = match kind.as_str() {
            "string" => Value::Str(self.text("string")?),
            "int" | "i4" | "i8" => {
                let t = self.text(&kind)?;
                Value::Int(
                    t.trim()
                        .parse()
                        .map_err(|_| format!("<{kind}>{t}</{kind}>: not an integer"))?,
                )
            }
            "boolean" => match self.text("boolean")?.trim() {
                "0" => Value::Bool(false),
                "1" => Value::Bool(true),
                t => return Err(format!("<boolean>{t}</boolean>: expected 0 or 1")),
            },
            "array" => {
                self.open("data")?;
                let mut items = Vec::new();
                while !self.at_close("data") {
                    items.push(self.value(depth + 1)?);
                }
                self.close("data")?;
                self.close("array")?;
                Value::Array(items)
            }
            "struct" => {
                let mut members = Vec::new();
                while !self.at_close("struct") {
                    self.open("member")?;
                    self.open("name")?;
                    let name = self.text("name")?;
                    members.push((name, self.value(depth + 1)?));
                    self.close("member")?;
                }
                self.close("struct")?;
                Value::Struct(members)
            }
            "double" | "base64" | "dateTime.iso8601" | "nil" => {
                let name = match kind.as_str() {
                    "double" => "double",
                    "base64" => "base64",
                    "nil" => "nil",
                    _ => "dateTime.iso8601",
                };
                self.text(&kind)?;
                Value::Other(name)
            }
            other => return Err(format!("unknown value type <{other}>")),
        };
        self.close("value")?;
        Ok(value)
    }
}

fn describe(tok: Option<&Tok>) -> String {
    match tok {
        Some(Tok::Open(n)) => format!("<{n}>"),
        Some(Tok::Close(n)) => format!("</{n}>"),
        Some(Tok::Text(t)) => format!("text {:?}", t.chars().take(32).collect::<String>()),
        None => "the end of the document".into(),
    }
}

/// Parses a `<methodCall>`: faults for what is not XML, and for XML that is not a call.
fn parse_call(body: &[u8]) -> Result<(String, Vec<Value>), Fault> {
    let xml = std::str::from_utf8(body)
        .map_err(|_| Fault::new(FAULT_PARSE, "parse error: the body is not UTF-8"))?;
    let toks = tokenize(xml).map_err(|e| Fault::new(FAULT_PARSE, format!("parse error: {e}")))?;
    if !toks.iter().any(|t| matches!(t, Tok::Open(_))) {
        return Err(Fault::new(FAULT_PARSE, "parse error: no XML element in the body"));
    }
    Parser { toks, pos: 0 }
        .call()
        .map_err(|e| Fault::new(FAULT_REQUEST, format!("invalid request: {e}")))
}

/// Appends `s` as XML character data: escaped, and with every character XML 1.0 cannot
/// carry (control characters other than tab, line feed and carriage return; U+FFFE and
/// U+FFFF) replaced by U+FFFD. A carriage return is written as a reference so that it
/// survives the reader's line-end normalisation.
fn escape_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\r' => out.push_str("&#13;"),
            '\t' | '\n' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
}

fn value_xml(out: &mut String, v: &Value) {
    out.push_str("<value>");
    match v {
        Value::Str(s) => {
            out.push_str("<string>");
            escape_into(out, s);
            out.push_str("</string>");
        }
        Value::Int(i) => {
            let _ = write!(out, "<int>{i}</int>");
        }
        Value::Bool(b) => {
            let _ = write!(out, "<boolean>{}</boolean>", *b as u8);
        }
        Value::Array(items) => {
            out.push_str("<array><data>");
            for item in items {
                value_xml(out, item);
            }
            out.push_str("</data></array>");
        }
        Value::Struct(members) => {
            out.push_str("<struct>");
            for (name, value) in members {
                out.push_str("<member><name>");
                escape_into(out, name);
                out.push_str("</name>");
                value_xml(out, value);
                out.push_str("</member>");
            }
            out.push_str("</struct>");
        }
        Value::Other(_) => out.push_str("<nil/>"),
    }
    out.push_str("</value>");
}

fn response_xml(result: &Result<Value, Fault>) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<methodResponse>");
    match result {
        Ok(v) => {
            out.push_str("<params><param>");
            value_xml(&mut out, v);
            out.push_str("</param></params>");
        }
        Err(f) => {
            out.push_str("<fault>");
            let fault = Value::Struct(vec![
                ("faultCode".into(), Value::Int(f.code.into())),
                ("faultString".into(), Value::Str(f.message.clone())),
            ]);
            value_xml(&mut out, &fault);
            out.push_str("</fault>");
        }
    }
    out.push_str("</methodResponse>\n");
    out
}

// ---------------------------------------------------------------------------------------
// The worker: HTTP, XML-RPC, the policy's check, and the call to the helper
// ---------------------------------------------------------------------------------------

/// A worker's handler: it runs as `--user` (default `nobody`), with no capability, and
/// cannot start a process as anyone (under `--sandbox`, no process at all): it asks its
/// privileged helper ([`RunHelper`]) for what the policy allows.
struct RunAs {
    policy: Rc<Policy>,
    /// `--unchecked-workers` (tests only): forward every call to the helper unchecked.
    unchecked: bool,
}

impl appsrv::RequestHandler for RunAs {
    type Codec = Http;
    type Session = ();

    fn codec(&self) -> Http {
        Http::new().max_body(MAX_BODY)
    }

    fn handle_request(
        &mut self,
        conn: &mut appsrv::Conn<'_>,
        req: &HttpRequest<'_>,
        res: &mut HttpResponse<'_>,
    ) -> io::Result<()> {
        if req.path() != "/RPC2" && req.path() != "/" {
            return plain(res, 404, "not found: the XML-RPC endpoint is /RPC2\n");
        }
        if req.method() != "POST" {
            res.header("Allow", "POST");
            return plain(res, 405, "method not allowed: XML-RPC calls are POSTed\n");
        }
        // text/xml, as the specification says. It also keeps browsers from sending a call
        // cross-site without a CORS preflight (which this server never grants).
        let xml_type = req.header_str("Content-Type").is_some_and(|t| {
            let t = t.split(';').next().unwrap_or("").trim();
            t.eq_ignore_ascii_case("text/xml") || t.eq_ignore_ascii_case("application/xml")
        });
        if !xml_type {
            return plain(res, 415, "unsupported media type: send text/xml\n");
        }
        let mut result =
            parse_call(req.body()).and_then(|(method, params)| self.call(conn, &method, &params));
        if let Err(f) = &mut result {
            // A wrong token, found by this worker's check or by its helper's: the client's
            // address is refused new connections for a while, across all workers (1 s,
            // doubling with each failure in a row, up to --penalty-max), and this
            // connection ends after the fault. Guessing the token is slowed from about
            // 8,000 attempts a second to a handful a minute, then one per --penalty-max.
            if f.code == FAULT_AUTH {
                if let Some(wait) = conn.penalize() {
                    let _ = write!(
                        f.message,
                        "; new connections from your address are refused for {} s",
                        wait.as_secs_f64().ceil()
                    );
                }
            }
        }
        if let Err(f) = &result {
            tracing::warn!("fault {}: {}", f.code, f.message);
        }
        res.content_type("text/xml; charset=utf-8");
        res.write_all(response_xml(&result).as_bytes())
    }
}

fn plain(res: &mut HttpResponse<'_>, status: u16, text: &str) -> io::Result<()> {
    res.status(status).content_type("text/plain; charset=utf-8");
    res.write_all(text.as_bytes())
}

/// How much longer than a command's timeout and its drain ([`DRAIN_AFTER_KILL`]) a worker
/// waits for its helper's answer: the helper's own work around the command (the fork,
/// the reap, the leftovers' kill) on a loaded machine.
const CALL_MARGIN: Duration = Duration::from_secs(10);

impl RunAs {
    fn call(&self, conn: &appsrv::Conn<'_>, method: &str, params: &[Value]) -> Result<Value, Fault> {
        match method {
            "run" => self.run(conn, params),
            other => {
                let shown: String = other.chars().take(64).collect();
                Err(Fault::new(FAULT_METHOD, format!("unknown method: {shown:?}")))
            }
        }
    }

    /// `run(token, user, command, args)`: checked here, then asked of the helper, which
    /// checks again and runs it.
    fn run(&self, conn: &appsrv::Conn<'_>, params: &[Value]) -> Result<Value, Fault> {
        const SIGNATURE: &str = "run(token, user, command, args) takes three strings and an array of strings";
        let [
            Value::Str(token),
            Value::Str(user),
            Value::Str(command),
            Value::Array(args),
        ] = params
        else {
            let got: Vec<&str> = params.iter().map(Value::type_name).collect();
            return Err(Fault::new(
                FAULT_PARAMS,
                format!("invalid params: {SIGNATURE}, not ({})", got.join(", ")),
            ));
        };
        let args: Vec<&str> = args
            .iter()
            .enumerate()
            .map(|(i, a)| match a {
                Value::Str(s) => Ok(s.as_str()),
                other => Err(Fault::new(
                    FAULT_PARAMS,
                    format!(
                        "invalid params: {SIGNATURE}; args[{i}] is of type {}",
                        other.type_name()
                    ),
                )),
            })
            .collect::<Result<_, _>>()?;
        // The worker's check answers what the policy refuses without a round trip to the
        // helper; the helper's check is the one that counts.
        if !self.unchecked {
            self.policy.check(token, user, command, &args)?;
        }
        let mut helper = conn.privileged::<RunHelper>();
        if let Some(rule) = self.policy.commands.get(command.as_str()) {
            helper = helper.timeout(rule.timeout + DRAIN_AFTER_KILL + CALL_MARGIN);
        }
        let request = Request::Run {
            token: token.clone(),
            user: user.clone(),
            command: command.clone(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
        };
        match helper.call(&request) {
            Ok(Ok(ran)) => Ok(ran.into_value()),
            // The helper's refusal (its check failed) or the command's failure to start:
            // the fault as the helper wrote it.
            Ok(Err(fault)) => Err(fault),
            // The helper is gone (the worker stops after this connection and the master
            // replaces it, with a new helper), did not answer in time, or could not read
            // the request: the command did not run, or its outcome is lost.
            Err(e) => {
                let shown: String = command.chars().take(64).collect();
                tracing::error!("run {shown:?} as {user:?}: {e}");
                Err(Fault::new(
                    FAULT_EXEC,
                    format!("could not run command {shown:?}: {e}"),
                ))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The privileged helper: the check again, and the command as its user
// ---------------------------------------------------------------------------------------

/// What a worker may ask of its helper: one operation, with the client's words, never a
/// program path or a command line (the helper finds the program in its own policy).
#[derive(Serialize, Deserialize)]
enum Request {
    /// Runs the policy's command named `command` as `user` with `args`, if the policy
    /// allows it with `token`.
    Run {
        token: String,
        user: String,
        command: String,
        args: Vec<String>,
    },
}

/// How a command ended, as the helper reports it.
#[derive(Serialize, Deserialize)]
struct Ran {
    /// The exit code, -1 when a signal ended the command.
    status: i32,
    /// The signal that ended it, 0 if none.
    signal: i32,
    timed_out: bool,
    /// The first [`OUTPUT_CAP`] bytes of each.
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stdout_truncated: bool,
    stderr_truncated: bool,
}

impl Ran {
    fn into_value(self) -> Value {
        let text = |b: &[u8]| Value::Str(String::from_utf8_lossy(b).into_owned());
        Value::Struct(vec![
            ("status".into(), Value::Int(self.status.into())),
            ("signal".into(), Value::Int(self.signal.into())),
            ("timed_out".into(), Value::Bool(self.timed_out)),
            ("stdout".into(), text(&self.stdout)),
            ("stderr".into(), text(&self.stderr)),
            ("stdout_truncated".into(), Value::Bool(self.stdout_truncated)),
            ("stderr_truncated".into(), Value::Bool(self.stderr_truncated)),
        ])
    }
}

/// The privileged helper of a worker: uid 0 with only the capabilities below, it takes
/// [`Request`]s, checks each against its own copy of the policy (the master's, as loaded
/// at start or by the last reload, inherited through the worker's fork), and runs what
/// the policy allows as the command's user.
struct RunHelper {
    policy: Rc<Policy>,
    /// The programs of the policy at start: the only ones a sandboxed helper may execute.
    at_start: Rc<BTreeSet<PathBuf>>,
}

impl Privileged for RunHelper {
    type Request = Request;
    type Response = Result<Ran, Fault>;
    /// What running a command as another user takes, and nothing else:
    /// - `CAP_SETUID`: `setresuid` to the target user, in the child;
    /// - `CAP_SETGID`: `setgroups` (the user's groups) and `setresgid`, in the child;
    /// - `CAP_KILL`: killing the command's process group at its end or its timeout, and
    ///   what it left behind (`kill_leftovers`), processes of another user.
    ///
    /// Not needed: `CAP_SYS_RESOURCE` (the rlimits are only ever lowered), the
    /// `CAP_DAC_*` capabilities (the helper opens only `/dev/null`; the policy and the
    /// token are read by the master; the child executes the program and enters the home
    /// directory as the user), `CAP_SETPCAP` (the child's change of uid clears every
    /// capability). RLIMIT_NPROC does not limit the helper's forks: uid 0 is exempt.
    const CAPABILITIES: &'static [Capability] = &[
        Capability::CAP_SETUID,
        Capability::CAP_SETGID,
        Capability::CAP_KILL,
    ];

    fn handle(&mut self, request: Request, caller: &Caller) -> Result<Ran, Fault> {
        let Request::Run {
            token,
            user,
            command,
            args,
        } = request;
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // Again, whatever the worker checked: it parses the network's bytes, and may have
        // been made to ask anything.
        let (rule, target) = self
            .policy
            .check(&token, &user, &command, &args)
            .inspect_err(|f| {
                tracing::warn!(
                    "refused a request of worker {} (pid {}): fault {}: {}",
                    caller.worker(),
                    caller.pid(),
                    f.code,
                    f.message
                );
            })?;
        let outcome = execute(rule, target, &args);
        // What left the command's process group (setsid, setpgid) and outlived it is now
        // the helper's child (a subreaper): killed, now that the command is reaped.
        let killed = appsrv::privileged::kill_leftovers();
        if killed > 0 {
            tracing::warn!(
                "ran {command:?} {args:?} as {user:?}: killed {killed} process(es) it left \
                 running outside its process group (setsid, setpgid)"
            );
        }
        let outcome = outcome.map_err(|e| {
            let reason = match e.raw_os_error() {
                // From execve after setresuid: the user is over RLIMIT_NPROC.
                Some(libc::EAGAIN) => format!(
                    "user {user:?} has too many processes (max_processes is {}, and every \
                     process of the user counts)",
                    rule.limits.processes
                ),
                Some(libc::ENOTRECOVERABLE) => "the change of user could not be verified".into(),
                // Landlock's refusal, for a program a reload added (see sandbox_profile).
                Some(libc::EACCES) if !self.at_start.contains(&rule.program) => format!(
                    "{e}; {} was not in the policy when runas started, and with --sandbox \
                     commands can execute only the programs allowed at start: restart runas",
                    rule.program.display()
                ),
                _ => e.to_string(),
            };
            tracing::error!("run {command:?} as {user:?}: {reason}");
            Fault::new(FAULT_EXEC, format!("could not run command {command:?}: {reason}"))
        })?;
        tracing::info!(
            "ran {command:?} {args:?} as {user:?} (uid {}) for worker {}: {} in {:.3} s, {} + {} bytes of output",
            target.uid,
            caller.worker(),
            outcome.describe(rule.timeout),
            outcome.elapsed.as_secs_f64(),
            outcome.stdout.total,
            outcome.stderr.total
        );
        if outcome.held_open {
            tracing::warn!(
                "ran {command:?} {args:?} as {user:?}: its output was still open {} s after it \
                 ended and its process group was killed: a process that left the group \
                 (setsid, setpgid) held it",
                DRAIN_AFTER_KILL.as_secs()
            );
        }
        Ok(outcome.into_ran())
    }
}

// ---------------------------------------------------------------------------------------
// Running a command
// ---------------------------------------------------------------------------------------

/// The first [`OUTPUT_CAP`] bytes of a stream, and how many there were in all.
struct Capture {
    kept: Vec<u8>,
    total: u64,
}

impl Capture {
    fn push(&mut self, bytes: &[u8]) {
        let room = OUTPUT_CAP - self.kept.len();
        self.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
        self.total += bytes.len() as u64;
    }

    fn truncated(&self) -> bool {
        self.total > self.kept.len() as u64
    }
}

struct Outcome {
    status: std::process::ExitStatus,
    timed_out: bool,
    /// A pipe was still open [`DRAIN_AFTER_KILL`] after the group was killed: a process
    /// that left the group holds it, and survived.
    held_open: bool,
    stdout: Capture,
    stderr: Capture,
    elapsed: Duration,
}

impl Outcome {
    fn describe(&self, timeout: Duration) -> String {
        match (self.timed_out, self.status.code(), self.status.signal()) {
            (true, _, _) => format!("killed after its timeout of {} s", timeout.as_secs_f64()),
            (false, Some(code), _) => format!("exit status {code}"),
            (false, None, Some(sig)) => format!("killed by signal {sig}"),
            _ => "ended".into(),
        }
    }

    fn into_ran(self) -> Ran {
        Ran {
            status: self.status.code().unwrap_or(-1),
            signal: self.status.signal().unwrap_or(0),
            timed_out: self.timed_out,
            stdout_truncated: self.stdout.truncated(),
            stderr_truncated: self.stderr.truncated(),
            stdout: self.stdout.kept,
            stderr: self.stderr.kept,
        }
    }
}

/// What the child does between `fork` and `execve`, prepared before the fork so that the
/// child only makes system calls: no allocation, no lock, nothing that is not
/// async-signal-safe (the helper's other threads, if any, may have held locks at fork).
struct ChildSetup {
    uid: Uid,
    gid: Gid,
    groups: Vec<Gid>,
    home: CString,
    /// The resource limits to set (soft, hard).
    rlimits: [(Resource, u64, u64); 6],
    /// The helper's pid: the child's parent, checked after the parent-death signal is set.
    parent: Pid,
    /// Where to stop marking descriptors close-on-exec if `close_range` is unavailable.
    max_fd: i32,
    /// The last signal number (SIGRTMAX).
    last_signal: i32,
}

impl ChildSetup {
    fn new(target: &Target, limits: Limits) -> ChildSetup {
        let max_fd = nix::sys::resource::getrlimit(Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| soft.min(65_536) as i32)
            .unwrap_or(1024);
        ChildSetup {
            uid: target.uid,
            gid: target.gid,
            groups: target.groups.clone(),
            home: CString::new(target.home.as_os_str().as_encoded_bytes()).unwrap_or_else(|_| c"/".into()),
            rlimits: rlimits(limits),
            parent: nix::unistd::getpid(),
            max_fd,
            last_signal: libc::SIGRTMAX(),
        }
    }

    /// Runs in the child after `fork`, before `execve` (std has already connected stdin,
    /// stdout and stderr, and the environment is passed to `execve` as prepared). Only
    /// async-signal-safe system calls; an error is reported to `spawn` by std, and the
    /// child exits without running the program.
    fn apply(&self) -> io::Result<()> {
        // A session and process group of its own: the timeout kills the whole group, and
        // the command has no controlling terminal and gets no signal meant for appsrv's
        // process group (a Ctrl-C on the master's terminal, say).
        nix::unistd::setsid()?;

        // Default dispositions for every signal, and an empty mask (dispositions set to
        // "ignore" and the mask survive exec). The helper (as its worker) catches TERM, INT, QUIT, USR1 and
        // others and ignores PIPE; and glibc's posix_spawn, which a service manager or a
        // shell may have started this program with, leaves its internal signal 32 ignored,
        // which glibc's sigaction refuses to touch. So this is the raw system call, with
        // an all-zero kernel `struct sigaction`: SIG_DFL, no flags, an empty mask. KILL
        // and STOP cannot change; the kernel refuses them and those past its last signal.
        for sig in 1..=self.last_signal {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let action = [0 as libc::c_ulong; 4];
            // SAFETY: rt_sigaction(2) is async-signal-safe; `action` is larger than the
            // kernel's struct sigaction, and all zeroes is SIG_DFL with no flags and an
            // empty mask, so no handler code is installed. 8 is the size of the kernel's
            // signal set (64 signals).
            unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    action.as_ptr(),
                    std::ptr::null_mut::<u8>(),
                    8usize,
                );
            }
        }
        signal::sigprocmask(signal::SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;

        // Resource limits, soft and hard, while still root (only root could raise a hard
        // limit again; the command cannot).
        for &(resource, soft, hard) in &self.rlimits {
            nix::sys::resource::setrlimit(resource, soft, hard)?;
        }

        // The identity, in the only order that works: groups, then gid, then uid (after
        // the uid change, the right to change groups is gone). std's `CommandExt::uid`
        // would clear the supplementary groups rather than set the user's.
        nix::unistd::setgroups(&self.groups)?;
        nix::unistd::setresgid(self.gid, self.gid, self.gid)?;
        nix::unistd::setresuid(self.uid, self.uid, self.uid)?;
        // Check it: all three uids and gids are the target's, and root cannot come back.
        let verified = nix::unistd::getresuid()
            .is_ok_and(|r| r.real == self.uid && r.effective == self.uid && r.saved == self.uid)
            && nix::unistd::getresgid()
                .is_ok_and(|r| r.real == self.gid && r.effective == self.gid && r.saved == self.gid)
            && nix::unistd::setuid(Uid::from_raw(0)).is_err()
            && nix::unistd::setgid(Gid::from_raw(0)).is_err();
        if !verified {
            return Err(io::Error::from_raw_os_error(libc::ENOTRECOVERABLE));
        }

        // Killed if the helper dies (set after the uid change, which clears it), and
        // checked: the worker may have died before it took effect.
        // SAFETY: prctl(PR_SET_PDEATHSIG) and getppid are plain system calls.
        unsafe {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != self.parent.as_raw() {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
        }

        // The home directory, as the user (a home the user cannot enter is not used), or
        // the root directory; and a umask that makes no file writable by others.
        // SAFETY: chdir and umask are plain system calls; both strings are NUL-terminated
        // and outlive the calls.
        unsafe {
            if libc::chdir(self.home.as_ptr()) != 0 && libc::chdir(c"/".as_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
            libc::umask(0o022);
        }

        // Every descriptor above stderr close-on-exec: appsrv's are already, but
        // descriptors a master inherited (from systemd, or its own parent) may not be.
        // Marking rather than closing keeps the pipe std uses to report a failed exec.
        const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
        // SAFETY: close_range(2) and fcntl(2) only change this process's descriptor flags.
        unsafe {
            if libc::syscall(
                libc::SYS_close_range,
                3 as libc::c_uint,
                libc::c_uint::MAX,
                CLOSE_RANGE_CLOEXEC,
            ) != 0
            {
                // Before Linux 5.11: one descriptor at a time.
                for fd in 3..self.max_fd {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
        }
        Ok(())
    }
}

/// The resource limits of a command: the policy's, or the helper's own hard limit where
/// that is lower (a limit is only ever lowered). The CPU time's hard limit is one second
/// above the soft one: SIGXCPU first, then SIGKILL.
fn rlimits(l: Limits) -> [(Resource, u64, u64); 6] {
    let cap = |resource: Resource, soft: u64, hard: u64| {
        let max = nix::sys::resource::getrlimit(resource).map_or(u64::MAX, |(_, hard)| hard);
        (resource, soft.min(max), hard.min(max))
    };
    [
        cap(Resource::RLIMIT_CPU, l.cpu_secs, l.cpu_secs + 1),
        cap(Resource::RLIMIT_AS, l.memory_bytes, l.memory_bytes),
        cap(Resource::RLIMIT_FSIZE, l.file_bytes, l.file_bytes),
        cap(Resource::RLIMIT_NPROC, l.processes, l.processes),
        cap(Resource::RLIMIT_CORE, 0, 0),
        cap(Resource::RLIMIT_NOFILE, 256, 256),
    ]
}

/// How long the output pipes are still read once the command has ended (exited, or been
/// killed at its timeout) and its process group has been killed. The killed processes
/// close their ends as they die, within milliseconds, so this bounds only the case of a
/// process that left the group (`setsid`, `setpgid`) and still holds a pipe: the call
/// then answers this long after the command ended, with what was read, and the log says
/// so. A call takes at most the command's timeout plus this.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);

/// Runs `rule`'s program as `target` with `args`, and collects its output.
///
/// The order matters: (1) read the output until the command (the group's leader) exits or
/// the timeout passes, learning of the exit without reaping it; (2) kill the whole process
/// group with SIGKILL, which ends what the command left running (`sh -c "daemon &"`, with
/// TERM and HUP ignored or not); (3) read what is left in the pipes until they close;
/// (4) reap the command. Until (4), the exited leader is a zombie that keeps its pid, which
/// is the group's id, from being reused by another process: so the kill in (2) can only
/// reach the command's own group. Killing after the reap could hit an unrelated group that
/// got the same number.
fn execute(rule: &Rule, target: &Target, args: &[&str]) -> io::Result<Outcome> {
    let mut cmd = Command::new(&rule.program);
    cmd.args(args)
        .env_clear()
        .env("HOME", &target.home)
        .env("USER", &target.name)
        .env("LOGNAME", &target.name)
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let setup = ChildSetup::new(target, rule.limits);
    // SAFETY: `apply` makes only async-signal-safe system calls on data prepared before
    // the fork (no allocation, no lock), as a pre_exec closure must.
    unsafe { cmd.pre_exec(move || setup.apply()) };
    let started = Instant::now();
    let mut child = cmd.spawn()?;
    let mut output = Output::take(&mut child);
    let ended = output.until_exit(&child, started + rule.timeout);
    // Exited, timed out or failed: the group goes, before the reap (see above).
    kill_group(&child);
    let drained = match ended {
        Ok(_) => output.drain(Instant::now() + DRAIN_AFTER_KILL),
        Err(_) => Ok(true),
    };
    // Always reaped, so no zombie is left, whatever failed.
    let status = child.wait();
    reap_group(&child);
    let timed_out = ended?;
    let closed = drained?;
    let [stdout, stderr] = output.captures;
    Ok(Outcome {
        status: status?,
        timed_out,
        held_open: !closed,
        stdout,
        stderr,
        elapsed: started.elapsed(),
    })
}

/// Kills the command's process group with SIGKILL: the command and everything it started,
/// unless they left the group. Called before the command is reaped, so its pid, which is
/// the group's id, cannot have been reused (see [`execute`]).
fn kill_group(child: &Child) {
    let pid = Pid::from_raw(child.id() as i32);
    let _ = signal::killpg(pid, Signal::SIGKILL);
    // The command itself, should it have left its group (it cannot: it leads its own
    // session, and a session leader cannot change its group; this is cheap insurance).
    let _ = signal::kill(pid, Signal::SIGKILL);
}

/// Reaps the rest of the command's killed process group: the processes the command started
/// in it were orphaned as it exited and, the helper being a child subreaper, became the
/// helper's children. Each was killed with the group, so the wait is short; once none is
/// left, what the helper still has as children left the group (`kill_leftovers`).
fn reap_group(child: &Child) {
    let group = Pid::from_raw(-(child.id() as i32));
    // Until ECHILD: no child of the helper is left in the group.
    while let Ok(_) | Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(group, None) {}
}

/// The command's stdout and stderr as they are read: the pipes still open, and what is
/// kept of each. One thread, `poll` on both pipes (and on a pidfd for the exit), so
/// neither pipe can fill up and block the command while the other is read.
struct Output {
    pipes: [Option<OwnedFd>; 2],
    captures: [Capture; 2],
    buf: Vec<u8>,
}

impl Output {
    fn take(child: &mut Child) -> Output {
        let empty = || Capture {
            kept: Vec::new(),
            total: 0,
        };
        Output {
            pipes: [
                child.stdout.take().map(OwnedFd::from),
                child.stderr.take().map(OwnedFd::from),
            ],
            captures: [empty(), empty()],
            buf: vec![0u8; 16 * 1024],
        }
    }

    /// Reads the output until the command exits (`false`) or `deadline` passes (`true`:
    /// it timed out), whether or not the pipes are still open: what the command left
    /// running may hold them open for ever. The command is not reaped.
    fn until_exit(&mut self, child: &Child, deadline: Instant) -> io::Result<bool> {
        // A pidfd (Linux 5.3) becomes readable when the child exits, without reaping it;
        // waitid says so for certain (see has_exited).
        // SAFETY: pidfd_open on our own unreaped child; a non-negative result is a new
        // descriptor that we own.
        let pidfd = unsafe {
            let fd = libc::syscall(libc::SYS_pidfd_open, child.id() as libc::pid_t, 0);
            (fd >= 0).then(|| OwnedFd::from_raw_fd(fd as i32))
        };
        let mut look = true;
        loop {
            if look && has_exited(child)? {
                return Ok(false);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(true);
            }
            let mut wait = deadline - now;
            if pidfd.is_none() {
                // No pidfd: look at the child every 50 ms.
                wait = wait.min(Duration::from_millis(50));
            }
            let exit_ready = self.step(pidfd.as_ref().map(|p| p.as_fd()), wait)?;
            look = pidfd.is_none() || exit_ready;
        }
    }

    /// Reads until both pipes are closed (`true`) or `until` passes (`false`: a process
    /// outside the killed group holds one; the rest of its output is not read).
    fn drain(&mut self, until: Instant) -> io::Result<bool> {
        while self.pipes.iter().any(Option::is_some) {
            let now = Instant::now();
            if now >= until {
                return Ok(false);
            }
            self.step(None, until - now)?;
        }
        Ok(true)
    }

    /// Waits at most `wait` for an open pipe or `exit` to be ready, and reads each ready
    /// pipe once (end of file closes it). Returns whether `exit` was ready.
    fn step(&mut self, exit: Option<std::os::fd::BorrowedFd<'_>>, wait: Duration) -> io::Result<bool> {
        let timeout = PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX);
        let mut fds = Vec::with_capacity(3);
        let mut which = Vec::with_capacity(3);
        for (i, p) in self.pipes.iter().enumerate() {
            if let Some(p) = p {
                fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
                which.push(i);
            }
        }
        if let Some(fd) = exit {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
            which.push(2);
        }
        match nix::poll::poll(&mut fds, timeout) {
            // A stop signal interrupts poll (the worker's handlers have no SA_RESTART):
            // the command may finish, within its timeout, as the connection may.
            Err(nix::errno::Errno::EINTR) => return Ok(false),
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        let ready: Vec<usize> = fds
            .iter()
            .zip(&which)
            .filter(|(fd, _)| fd.revents().is_some_and(|r| !r.is_empty()))
            .map(|(_, &i)| i)
            .collect();
        drop(fds);
        let mut exit_ready = false;
        for i in ready {
            if i == 2 {
                exit_ready = true;
                continue;
            }
            let read = nix::unistd::read(self.pipes[i].as_ref().expect("a polled pipe"), &mut self.buf);
            match read {
                Ok(0) => self.pipes[i] = None,
                Ok(n) => self.captures[i].push(&self.buf[..n]),
                Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(exit_ready)
    }
}

/// Whether the child has exited, from `waitid(P_PID, pid, WEXITED | WNOHANG | WNOWAIT)`:
/// without reaping it (`WNOWAIT`), so that its pid stays ours and its group can still be
/// killed safely.
fn has_exited(child: &Child) -> io::Result<bool> {
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::Pid(Pid::from_raw(child.id() as i32)), flags) {
        Ok(WaitStatus::StillAlive) => Ok(false),
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

// ---------------------------------------------------------------------------------------
// The sandbox (--sandbox)
// ---------------------------------------------------------------------------------------

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
/// module documentation).
fn sandbox_profile(policy: &Policy) -> Result<appsrv::Sandbox, String> {
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

// ---------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------

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
