//! Tests that can run only where a condition holds (root, an external program, IPv6
//! loopback), reported as *ignored, with the reason*, where it does
//! not, never as passed (issue 41: they printed `skipped: needs root` and passed).
//!
//! The standard test harness cannot ignore a test at run time, so these tests run in a
//! libtest-mimic harness (`harness = false`): a file whose tests all have conditions has
//! its own `main` ([`main`]); a file with some keeps them out of `#[test]` and lists them
//! in `fn conditional() -> Vec<Trial>`, which `tests/conditional.rs` runs (the file is a
//! module there). Under `CI` (set by `.ci/run`, which runs as root with every program
//! installed) a missing root or program is a failure, not an ignore: there the tests must
//! run.

use libtest_mimic::{Completion, Failed, Trial};

use super::Io;

/// A condition a test needs.
#[derive(Debug, Clone, Copy)]
pub enum Need {
    /// Root (the workers run as another user, a tmpfs is mounted, ...).
    Root,
    /// An external program (found when `PROGRAM --version` can be started, whatever its
    /// exit status: `wrk` and `haproxy` refuse `--version`), and the Debian package that
    /// has it.
    Program(&'static str, &'static str),
    /// A module of Debian's `/usr/bin/python3`, and the Debian package that has it.
    PythonModule(&'static str, &'static str),
    /// A loopback IPv6 address (`[::1]`).
    Ipv6Loopback,
}

impl Need {
    /// Why the condition does not hold here, if it does not.
    pub fn unmet(self) -> Option<String> {
        use std::process::{Command, Stdio};
        let runs = |program: &str, args: &[&str]| {
            Command::new(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        match self {
            Need::Root => (!super::is_root()).then(|| "needs root".to_owned()),
            Need::Program(program, package) => Command::new(program)
                .arg("--version")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_err()
                .then(|| {
                    format!("{program} is not installed (Debian package {package}; .ci/run installs it)")
                }),
            Need::PythonModule(module, package) => {
                (!runs("/usr/bin/python3", &["-c", &format!("import {module}")])).then(|| {
                    format!("python3 cannot import {module} (Debian package {package}; .ci/run installs it)")
                })
            }
            Need::Ipv6Loopback => std::net::TcpListener::bind("[::1]:0")
                .err()
                .map(|e| format!("no IPv6 loopback on this machine ([::1]: {e})")),
        }
    }

    /// Whether CI (`CI` set) guarantees the condition: `.ci/run` runs as root and installs
    /// every program; the machine's IPv6 is not its to choose.
    fn guaranteed_by_ci(self) -> bool {
        matches!(self, Need::Root | Need::Program(..) | Need::PythonModule(..))
    }
}

/// The first unmet need of `needs`: `Ok(None)` when all hold, `Ok(Some(reason))` to
/// ignore the test, `Err` when `CI` is set and it must hold there.
fn verdict(needs: &[Need]) -> Result<Option<String>, String> {
    for &need in needs {
        if let Some(why) = need.unmet() {
            if need.guaranteed_by_ci() && std::env::var_os("CI").is_some() {
                return Err(format!("CI is set, and this test must run there: {why}"));
            }
            return Ok(Some(why));
        }
    }
    Ok(None)
}

/// `name`, preceded by its file's name when the file is a module of `tests/conditional.rs`
/// (this module is then `conditional::FILE::util::needs`): `runas::issue_14_...`.
fn qualified(name: &str) -> String {
    match module_path!().split("::").collect::<Vec<_>>()[..] {
        [_, file, _, _] => format!("{file}::{name}"),
        _ => name.to_owned(),
    }
}

/// A test that runs when every one of `needs` holds and is reported ignored, with the
/// reason, otherwise.
pub fn test(name: &str, needs: &'static [Need], f: fn()) -> Trial {
    Trial::ignorable_test(qualified(name), move || match verdict(needs) {
        Ok(None) => {
            f();
            Ok(Completion::Completed)
        }
        Ok(Some(why)) => Ok(Completion::ignored_with(why)),
        Err(e) => Err(Failed::from(e)),
    })
}

/// [`test`] in each I/O model, named as `both_io!` names them (`name::blocking`,
/// `name::event`, `name::hybrid`).
pub fn each_io(name: &str, needs: &'static [Need], f: fn(Io)) -> Vec<Trial> {
    each_io_of(name, needs, &[Io::Blocking, Io::Event, Io::Hybrid], f)
}

/// [`test`] in each of `models` (`both_io!(blocking_event: ...)` is
/// `&[Io::Blocking, Io::Event]`).
pub fn each_io_of(name: &str, needs: &'static [Need], models: &[Io], f: fn(Io)) -> Vec<Trial> {
    models
        .iter()
        .map(|&io| {
            Trial::ignorable_test(
                qualified(&format!("{name}::{}", io.name())),
                move || match verdict(needs) {
                    Ok(None) => {
                        f(io);
                        Ok(Completion::Completed)
                    }
                    Ok(Some(why)) => Ok(Completion::ignored_with(why)),
                    Err(e) => Err(Failed::from(e)),
                },
            )
        })
        .collect()
}

/// Runs `trials` as a test binary does (the usual arguments: a filter, `--list`,
/// `--ignored`, `--test-threads`, ...). Libtest-mimic runs each trial on a thread of its
/// own and reports a panic as a failure, as libtest does.
pub fn main(trials: Vec<Trial>) -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    libtest_mimic::run(&args, trials).exit_code()
}
