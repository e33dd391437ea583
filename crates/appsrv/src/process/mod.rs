//! The process layer: what a Unix daemon does around its work. The pid file, detaching
//! from the terminal, the `stop` command, the log file and its line format, the workers'
//! notification pipe to the master, the log channel that hands each worker the reopened log
//! files, systemd's notification socket, re-executed workers,
//! and the hand-over of listening sockets to a new binary (upgrade, socket activation).

pub(crate) mod console;
pub(crate) mod daemon;
pub(crate) mod exec;
pub(crate) mod handover;
pub(crate) mod log;
pub(crate) mod notify;
pub(crate) mod reopen;
pub(crate) mod systemd;
