//! Connecting to the target, and the connection type (TCP or Unix).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use socket2::{Domain, SockAddr, Socket, Type};

/// Where to connect: `host:port` (resolved once, at start) or `unix:/path`.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    Tcp(Vec<SocketAddr>),
    Unix(PathBuf),
}

/// Checks the form of ADDR (a usage error if wrong) without resolving it.
pub(crate) fn check_addr(addr: &str) -> Result<String, String> {
    if let Some(path) = addr.strip_prefix("unix:") {
        if path.is_empty() {
            return Err("unix: must be followed by a socket path".to_string());
        }
        return Ok(addr.to_string());
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(addr.to_string()),
        _ => Err(format!("{addr:?} is neither HOST:PORT nor unix:/PATH")),
    }
}

impl Target {
    /// Resolves ADDR (already checked by [`check_addr`]).
    pub(crate) fn resolve(addr: &str) -> anyhow::Result<Target> {
        if let Some(path) = addr.strip_prefix("unix:") {
            return Ok(Target::Unix(PathBuf::from(path)));
        }
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .with_context(|| format!("cannot resolve {addr}"))?
            .collect();
        if addrs.is_empty() {
            bail!("cannot resolve {addr}: no address");
        }
        Ok(Target::Tcp(addrs))
    }

    /// Opens a connection, with `timeout` for the connect and for every later read and
    /// write. TCP connections have `TCP_NODELAY` (requests go out at once).
    pub(crate) fn connect(&self, timeout: Duration) -> io::Result<Stream> {
        match self {
            Target::Tcp(addrs) => {
                let mut last = None;
                for addr in addrs {
                    match connect(Domain::for_address(*addr), &SockAddr::from(*addr), timeout) {
                        Ok(s) => {
                            s.set_tcp_nodelay(true)?;
                            return Ok(Stream::Tcp(s.into()));
                        }
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or_else(|| io::Error::other("no address")))
            }
            Target::Unix(path) => {
                let s = connect(Domain::UNIX, &SockAddr::unix(path)?, timeout)?;
                Ok(Stream::Unix(s.into()))
            }
        }
    }
}

fn connect(domain: Domain, addr: &SockAddr, timeout: Duration) -> io::Result<Socket> {
    let s = Socket::new(domain, Type::STREAM, None)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    // On Linux a blocking connect gives up after SO_SNDTIMEO (socket(7)), which saves the
    // non-blocking connect and poll of `connect_timeout`.
    if cfg!(target_os = "linux") {
        s.connect(addr)?;
    } else {
        s.connect_timeout(addr, timeout)?;
    }
    Ok(s)
}

/// An open connection.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    /// Shuts both directions down, which wakes a thread blocked on the connection.
    pub(crate) fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Stream {
    #[inline]
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    #[inline]
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::check_addr;

    #[test]
    fn addr_forms() {
        assert!(check_addr("127.0.0.1:7001").is_ok());
        assert!(check_addr("localhost:80").is_ok());
        assert!(check_addr("[::1]:80").is_ok());
        assert!(check_addr("unix:/tmp/x.sock").is_ok());
        assert!(check_addr("unix:").is_err());
        assert!(check_addr("127.0.0.1").is_err());
        assert!(check_addr(":80").is_err());
        assert!(check_addr("host:http").is_err());
        assert!(check_addr("host:70000").is_err());
    }
}
