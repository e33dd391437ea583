//! Users, groups and the privilege drop of worker processes.
//!
//! Users and groups are resolved in the master, before any fork (name service lookups can
//! block, open files and sockets, and will not work after a chroot). Each worker then drops
//! to the resolved identity in the only safe order (supplementary groups, then the gid,
//! then the uid: once the uid is gone, the right to change groups is gone too) and checks
//! that root cannot be regained.

use std::ffi::CString;

use nix::unistd::{self, Gid, Group, Uid, User};

use crate::error::Error;

/// The user that workers run as when the master is root and no `--user` is given, as nginx
/// does; `--allow-root-workers` keeps them root instead.
pub(crate) const DEFAULT_USER: &str = "nobody";

/// A resolved identity for the workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) uid: Uid,
    pub(crate) gid: Gid,
    /// The supplementary groups: the user's groups from the group database (as
    /// `initgroups` would set them), or just `gid` when `--group` overrides the user's.
    pub(crate) groups: Vec<Gid>,
}

/// The identity workers take after the privilege drop, as the master resolved it from
/// `--user` and `--group`: what an application needs to prepare files or directories its
/// workers must write (a database, a socket directory) before they start. Returned by
/// [`Server::worker_identity`](crate::Server::worker_identity).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerIdentity {
    /// The user's name, as given (or `nobody`, the default for a master started as root).
    pub user: String,
    /// The user id workers switch to.
    pub uid: u32,
    /// The group id workers switch to (`--group`, or the user's primary group).
    pub gid: u32,
    /// The supplementary groups workers get (the user's groups, or only `gid` with
    /// `--group`).
    pub groups: Vec<u32>,
}

impl From<&Credentials> for WorkerIdentity {
    fn from(c: &Credentials) -> Self {
        WorkerIdentity {
            user: c.user.clone(),
            uid: c.uid.as_raw(),
            gid: c.gid.as_raw(),
            groups: c.groups.iter().map(|g| g.as_raw()).collect(),
        }
    }
}

/// What the master decided about the workers' identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Workers keep the master's identity (the master is not root, or root workers were
    /// asked for on purpose).
    Keep,
    /// Workers switch to these credentials after fork.
    Drop(Credentials),
}

/// Resolves `--user`/`--group` in the master.
///
/// Returns the plan and, when the master is root and no user was given, a line to log
/// (at INFO: the default is documented, not a mistake to warn about; issue 34).
pub(crate) fn resolve(
    user: Option<&str>,
    group: Option<&str>,
    allow_root_workers: bool,
) -> Result<(Plan, Option<String>), Error> {
    resolve_as(
        Uid::effective(),
        Gid::effective(),
        user,
        group,
        allow_root_workers,
    )
}

/// [`resolve`] for a master whose effective ids are `euid` and `egid` (the unit tests give
/// root's, so that root's plan is checked as any user: issue 41).
fn resolve_as(
    euid: Uid,
    egid: Gid,
    user: Option<&str>,
    group: Option<&str>,
    allow_root_workers: bool,
) -> Result<(Plan, Option<String>), Error> {
    let mut warning = None;
    let user = match user {
        Some(u) => u.to_owned(),
        None if !euid.is_root() || allow_root_workers => {
            if group.is_some() {
                return Err(Error::Config(
                    "--group needs --user (or a master started as root, whose workers default to nobody)"
                        .into(),
                ));
            }
            return Ok((Plan::Keep, None));
        }
        None => {
            warning = Some(format!(
                "started as root without --user: workers run as {DEFAULT_USER}, the documented default \
                 (--user to choose, --allow-root-workers to keep them root)"
            ));
            DEFAULT_USER.to_owned()
        }
    };
    let pw = lookup_user(&user)?;
    let gid = match group {
        Some(g) => lookup_group(g)?,
        None => pw.gid,
    };
    if !euid.is_root() {
        // Not root: the only identity we can "switch" to is our own.
        if pw.uid == euid && gid == egid {
            return Ok((Plan::Keep, warning));
        }
        return Err(Error::Privilege {
            what: format!("cannot run workers as user {user:?}"),
            reason: "the master is not running as root".into(),
        });
    }
    let groups = if group.is_some() {
        vec![gid]
    } else {
        let cname = CString::new(user.as_str()).map_err(|_| Error::Privilege {
            what: format!("user {user:?}"),
            reason: "the name contains a NUL byte".into(),
        })?;
        unistd::getgrouplist(&cname, gid).map_err(|e| Error::Privilege {
            what: format!("groups of user {user:?}"),
            reason: e.desc().into(),
        })?
    };
    Ok((
        Plan::Drop(Credentials {
            user,
            uid: pw.uid,
            gid,
            groups,
        }),
        warning,
    ))
}

fn lookup_user(name: &str) -> Result<User, Error> {
    let by_name = User::from_name(name).map_err(|e| Error::Privilege {
        what: format!("user {name:?}"),
        reason: format!("lookup failed: {}", e.desc()),
    })?;
    let found = match by_name {
        Some(u) => Some(u),
        None => match name.parse::<u32>() {
            Ok(id) => User::from_uid(Uid::from_raw(id)).ok().flatten(),
            Err(_) => None,
        },
    };
    found.ok_or_else(|| Error::Privilege {
        what: format!("user {name:?}"),
        reason: "no such user".into(),
    })
}

fn lookup_group(name: &str) -> Result<Gid, Error> {
    let by_name = Group::from_name(name).map_err(|e| Error::Privilege {
        what: format!("group {name:?}"),
        reason: format!("lookup failed: {}", e.desc()),
    })?;
    if let Some(g) = by_name {
        return Ok(g.gid);
    }
    match name.parse::<u32>() {
        Ok(id) => Ok(Gid::from_raw(id)),
        Err(_) => Err(Error::Privilege {
            what: format!("group {name:?}"),
            reason: "no such group".into(),
        }),
    }
}

/// Drops to `creds` irrevocably, in a worker: setgroups → setresgid → setresuid, then
/// verifies the result and that root cannot be regained.
pub(crate) fn drop_to(creds: &Credentials) -> Result<(), String> {
    let step = |what: &str, e: nix::Error| format!("{what} failed: {}", e.desc());
    unistd::setgroups(&creds.groups).map_err(|e| step("setgroups", e))?;
    unistd::setresgid(creds.gid, creds.gid, creds.gid).map_err(|e| step("setresgid", e))?;
    unistd::setresuid(creds.uid, creds.uid, creds.uid).map_err(|e| step("setresuid", e))?;

    let r = unistd::getresuid().map_err(|e| step("getresuid", e))?;
    let g = unistd::getresgid().map_err(|e| step("getresgid", e))?;
    if [r.real, r.effective, r.saved] != [creds.uid; 3] || [g.real, g.effective, g.saved] != [creds.gid; 3] {
        return Err(format!(
            "credentials not as expected after the drop: uid {r:?}, gid {g:?}"
        ));
    }
    let raw = |g: &[Gid]| g.iter().map(|g| g.as_raw()).collect::<Vec<_>>();
    let mut have = raw(&unistd::getgroups().map_err(|e| step("getgroups", e))?);
    let mut want = raw(&creds.groups);
    have.sort();
    have.dedup();
    want.sort();
    want.dedup();
    if have != want {
        return Err(format!(
            "supplementary groups not as expected after the drop: {have:?}"
        ));
    }
    if !creds.uid.is_root()
        && (unistd::setuid(Uid::from_raw(0)).is_ok() || unistd::seteuid(Uid::from_raw(0)).is_ok())
    {
        return Err("root could be regained after dropping privileges".into());
    }
    Ok(())
}

/// How a worker is confined beyond its identity: chroot, resource limits, umask,
/// no-new-privs and the sandbox. Decided in the master; applied by each worker after fork.
#[derive(Debug, Clone, Default)]
pub(crate) struct Confinement {
    /// `--chroot`: the worker's root directory.
    pub(crate) chroot: Option<std::path::PathBuf>,
    /// `--rlimit-nofile`, `--rlimit-core`, `--rlimit-as`: (resource, soft and hard limit).
    pub(crate) rlimits: Vec<(nix::sys::resource::Resource, u64)>,
    /// `--umask`.
    pub(crate) umask: Option<u32>,
    /// `--no-new-privs` (implied by the sandbox).
    pub(crate) no_new_privs: bool,
    /// `--sandbox`: the profile, compiled.
    pub(crate) sandbox: Option<crate::confine::sandbox::Compiled>,
    /// `--sandbox` with a privileged helper: the helper's profile, compiled.
    pub(crate) helper_sandbox: Option<crate::confine::sandbox::Compiled>,
}

impl Confinement {
    /// Checks in the master what can be checked before forking.
    pub(crate) fn check(&self) -> Result<(), Error> {
        if let Some(dir) = &self.chroot {
            if !dir.is_dir() {
                return Err(Error::Config(format!(
                    "--chroot {}: not a directory",
                    dir.display()
                )));
            }
            if !Uid::effective().is_root() {
                return Err(Error::Config(format!(
                    "--chroot {} needs a master started as root",
                    dir.display()
                )));
            }
        }
        // Without a chroot the workers see the master's files: a sandbox path that does not
        // exist would stop every worker at its start (issue 41: refused by check and start).
        if self.chroot.is_none() {
            for compiled in [&self.sandbox, &self.helper_sandbox].into_iter().flatten() {
                compiled
                    .profile
                    .check_paths()
                    .map_err(|e| Error::Config(format!("--sandbox: {e}")))?;
            }
        }
        Ok(())
    }

    /// The steps that need root, in a worker before the privilege drop: umask, resource
    /// limits (raising a hard limit needs root), chroot.
    pub(crate) fn before_drop(&self) -> Result<(), String> {
        if let Some(mask) = self.umask {
            nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(mask));
        }
        for &(resource, limit) in &self.rlimits {
            nix::sys::resource::setrlimit(resource, limit, limit)
                .map_err(|e| format!("setrlimit {resource:?} to {limit}: {}", e.desc()))?;
        }
        if let Some(dir) = &self.chroot {
            unistd::chroot(dir).map_err(|e| format!("chroot {}: {}", dir.display(), e.desc()))?;
            unistd::chdir("/").map_err(|e| format!("chdir / in the chroot: {}", e.desc()))?;
        }
        Ok(())
    }

    /// The steps after the privilege drop: no-new-privs, then the sandbox (Landlock, then
    /// seccomp). Returns a warning to log when the kernel enforces the sandbox only in part.
    pub(crate) fn after_drop(&self) -> Result<Option<String>, String> {
        if self.no_new_privs || self.sandbox.is_some() {
            nix::sys::prctl::set_no_new_privs().map_err(|e| format!("PR_SET_NO_NEW_PRIVS: {}", e.desc()))?;
        }
        match &self.sandbox {
            Some(sandbox) => sandbox.apply().map_err(|e| format!("sandbox: {e}")),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_user_is_a_clear_error() {
        let e = resolve(Some("no-such-user-appsrv"), None, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no-such-user-appsrv") && e.contains("no such user"),
            "{e}"
        );
    }

    #[test]
    fn unknown_group_is_a_clear_error() {
        let e = resolve(Some("nobody"), Some("no-such-group-appsrv"), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no-such-group-appsrv"), "{e}");
    }

    /// Issue 41: as root's plan (it returned early, passing, when not run as root).
    #[test]
    fn root_without_user_defaults_to_nobody_with_a_warning() {
        let root = (Uid::from_raw(0), Gid::from_raw(0));
        let (plan, warning) = resolve_as(root.0, root.1, None, None, false).unwrap();
        let Plan::Drop(c) = plan else {
            panic!("expected a drop")
        };
        assert_eq!(c.user, "nobody");
        assert!(warning.unwrap().contains("nobody"));
        assert_eq!(
            resolve_as(root.0, root.1, None, None, true).unwrap(),
            (Plan::Keep, None)
        );
    }
}
