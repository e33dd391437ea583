//! The `runas` example's privileged helper: one per worker, forked by it before it drops
//! root, uid 0 with `CAP_SETUID`, `CAP_SETGID` and `CAP_KILL` only. It reads nothing from
//! the network, only its worker's `Request`s; it checks each again against its own copy of
//! the policy, runs what the policy allows as the command's user (`exec::execute`), kills
//! what the command left behind, and logs what ran, as whom, and how it ended.
//!
//! It is a module of its own because it is the only code of the example that runs with
//! privilege: what it does with a request, and which capabilities it keeps, can be read
//! here without the parsing that the worker does.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::rc::Rc;

use appsrv::privileged::{Caller, Capability, Privileged};

use crate::exec::{DRAIN_AFTER_KILL, execute};
use crate::policy::Policy;
use crate::protocol::{Ran, Request};
use crate::xmlrpc::{FAULT_EXEC, Fault};

/// The privileged helper of a worker: uid 0 with only the capabilities below, it takes
/// [`Request`]s, checks each against its own copy of the policy (the master's, as loaded
/// at start or by the last reload, inherited through the worker's fork), and runs what
/// the policy allows as the command's user.
pub(crate) struct RunHelper {
    pub(crate) policy: Rc<Policy>,
    /// The programs of the policy at start: the only ones a sandboxed helper may execute.
    pub(crate) at_start: Rc<BTreeSet<PathBuf>>,
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
