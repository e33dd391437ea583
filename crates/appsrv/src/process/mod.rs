//! The process layer: what a Unix daemon does around its work. The pid file, the log file,
//! detaching from the terminal, the `stop` command (`daemon.rs`), what the client
//! subcommands print (`console.rs`), the log lines' format (`log.rs`), the workers'
//! notification pipe to the master (`notify.rs`), the log channel that hands each worker
//! the reopened log files (`reopen.rs`), systemd's notification socket (`systemd.rs`),
//! re-executed workers (`exec.rs`), and the hand-over of listening sockets to a new binary
//! (upgrade, socket activation: `handover.rs`).

pub(crate) mod console;
pub(crate) mod daemon;
pub(crate) mod exec;
pub(crate) mod handover;
pub(crate) mod log;
pub(crate) mod notify;
pub(crate) mod reopen;
pub(crate) mod systemd;
