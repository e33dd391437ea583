//! Confinement: what a worker may do once it serves clients. Resolving and dropping
//! privileges (groups, gid, uid, checked), and the optional sandbox (chroot, resource
//! limits, no-new-privs, Landlock, seccomp).

pub(crate) mod privilege;
pub(crate) mod sandbox;
