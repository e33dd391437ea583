//! The `runas` example's policy: the TOML file as written, checked and resolved when it
//! is loaded (users to uids and groups, programs owned by root, the token file private),
//! and its answer to a call, `Policy::check`, which a worker asks to refuse early and its
//! helper asks again before it runs anything.
//!
//! It is a module of its own because both sides of the trust boundary use it, and because
//! everything that can be wrong in a policy is found here, at load, in the master: before
//! `run` or `start` binds, or before a `reload` replaces the workers, never as a command
//! is about to run. The file's format is in the header of `runas.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use nix::unistd::{Gid, Uid, User};
use serde::Deserialize;

use crate::xmlrpc::{FAULT_ARGUMENT, FAULT_AUTH, FAULT_COMMAND, FAULT_USER, Fault};

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
pub(crate) struct Policy {
    pub(crate) token: Vec<u8>,
    pub(crate) commands: BTreeMap<String, Rule>,
}

/// An allowed command.
pub(crate) struct Rule {
    pub(crate) program: PathBuf,
    users: BTreeMap<String, Rc<Target>>,
    args: BTreeSet<String>,
    words: bool,
    max_args: usize,
    pub(crate) timeout: Duration,
    pub(crate) limits: Limits,
}

#[derive(Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) cpu_secs: u64,
    pub(crate) memory_bytes: u64,
    pub(crate) file_bytes: u64,
    pub(crate) processes: u64,
}

/// A user commands may run as, resolved when the policy is loaded.
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) uid: Uid,
    pub(crate) gid: Gid,
    /// The supplementary groups, as `initgroups` would set them.
    pub(crate) groups: Vec<Gid>,
    pub(crate) home: PathBuf,
}

impl Policy {
    /// Reads, checks and resolves the policy at `path`. Every error names the file and,
    /// where it applies, the command.
    pub(crate) fn load(path: &Path) -> Result<Policy, String> {
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
    pub(crate) fn check<'p>(
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

/// A plain word: see the example's documentation (the header of `runas.rs`).
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
