//! What the client subcommands (`stop`, `status`, `reload`, `health`, …) tell the person
//! or script that ran them, on stdout and stderr.
//!
//! `println!` and `eprintln!` panic when the write fails: `hello status | head -1` closes
//! the pipe before the second line, and a service manager may hand a command a stderr
//! whose reader has gone. A command that cannot print has nothing better to do than go on
//! and exit with its status, so these macros write with the error ignored. Nothing in the
//! crate uses `print!`, `println!`, `eprint!` or `eprintln!` (`tests/logs.rs` checks):
//! the server's own lines go through the log (`process/log.rs`), which counts what it
//! cannot write.

/// Writes a formatted line to stdout, ignoring a failed write.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stdout().lock(), $($arg)*);
    }};
}

/// Writes formatted text to stdout with no newline, ignoring a failed write.
macro_rules! out {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let mut stdout = ::std::io::stdout().lock();
        let _ = ::std::write!(stdout, $($arg)*);
        let _ = stdout.flush();
    }};
}

/// Writes a formatted line to stderr, ignoring a failed write.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr().lock(), $($arg)*);
    }};
}

pub(crate) use {errln, out, outln};
