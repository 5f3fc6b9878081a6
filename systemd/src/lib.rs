//! systemd integration: the sd_notify protocol and the unit files that run the node agent.
//!
//! [`Notifier`] speaks the notify protocol directly: datagrams of `KEY=value` lines to the
//! socket named by `NOTIFY_SOCKET` (a path, or an abstract name written `@name`). Without that
//! variable (not started by systemd with `Type=notify`) every call is a no-op.
//!
//! The watchdog settings come from `WATCHDOG_USEC` (and `WATCHDOG_PID`, which must be absent or
//! this process): the service pings `WATCHDOG=1` at half of that period, as sd_watchdog_enabled(3)
//! recommends. What "healthy" means is the caller's business (the kubelet pings only while its
//! sync loop turns).

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// Where notifications go; `None` inside when systemd is not listening.
#[derive(Debug, Clone, Default)]
pub struct Notifier {
    socket: Option<String>,
}

/// Why the environment's notify or watchdog settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("NOTIFY_SOCKET {0:?}: {1}")]
    Send(String, std::io::Error),
    #[error("WATCHDOG_USEC={0:?} is not a positive number of microseconds")]
    BadWatchdogUsec(String),
}

impl Notifier {
    /// The notifier named by this process's `NOTIFY_SOCKET`.
    pub fn from_env() -> Self {
        Self::new(std::env::var("NOTIFY_SOCKET").ok())
    }

    /// A notifier for `socket` (`None` or empty: a no-op).
    pub fn new(socket: Option<String>) -> Self {
        Self {
            socket: socket.filter(|s| !s.is_empty()),
        }
    }

    /// Whether systemd asked for notifications.
    pub fn enabled(&self) -> bool {
        self.socket.is_some()
    }

    /// Sends one message (`READY=1`, `STATUS=…`, `WATCHDOG=1`, `STOPPING=1`, or several lines).
    /// Returns whether a message was sent.
    pub fn notify(&self, state: &str) -> Result<bool, Error> {
        let Some(name) = &self.socket else {
            return Ok(false);
        };
        let err = |e| Error::Send(name.clone(), e);
        let addr = match name.strip_prefix('@') {
            Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name.as_bytes()),
            None => SocketAddr::from_pathname(name),
        }
        .map_err(err)?;
        let sock = UnixDatagram::unbound().map_err(err)?;
        sock.send_to_addr(state.as_bytes(), &addr).map_err(err)?;
        Ok(true)
    }
}

/// How often to ping the watchdog: half of `WATCHDOG_USEC`, when it is set and meant for this
/// process (`WATCHDOG_PID` absent or equal to `pid`).
pub fn watchdog_interval(
    usec: Option<&str>,
    watchdog_pid: Option<&str>,
    pid: u32,
) -> Result<Option<Duration>, Error> {
    let Some(usec) = usec.filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    if let Some(p) = watchdog_pid.filter(|p| !p.is_empty())
        && p.trim().parse::<u32>().ok() != Some(pid)
    {
        return Ok(None);
    }
    match usec.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(Some(Duration::from_micros(n) / 2)),
        _ => Err(Error::BadWatchdogUsec(usec.to_string())),
    }
}

/// [`watchdog_interval`] from this process's environment.
pub fn watchdog_interval_from_env() -> Result<Option<Duration>, Error> {
    watchdog_interval(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
        std::process::id(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recv(server: &UnixDatagram) -> String {
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 256];
        let n = server.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn sends_to_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::new(Some(path.to_string_lossy().into_owned()));
        assert!(n.enabled());
        assert!(n.notify("READY=1\nSTATUS=serving").unwrap());
        assert_eq!(recv(&server), "READY=1\nSTATUS=serving");
    }

    #[test]
    fn sends_to_an_abstract_socket() {
        let name = format!("node-systemd-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let server = UnixDatagram::bind_addr(&addr).unwrap();
        let n = Notifier::new(Some(format!("@{name}")));
        assert!(n.notify("WATCHDOG=1").unwrap());
        assert_eq!(recv(&server), "WATCHDOG=1");
    }

    #[test]
    fn without_a_socket_nothing_is_sent() {
        assert!(!Notifier::new(None).notify("READY=1").unwrap());
        assert!(!Notifier::new(Some(String::new())).enabled());
    }

    #[test]
    fn a_missing_socket_is_an_error_naming_it() {
        let n = Notifier::new(Some("/nonexistent/notify".into()));
        let e = n.notify("READY=1").unwrap_err().to_string();
        assert!(e.contains("/nonexistent/notify"), "{e}");
    }

    #[test]
    fn watchdog_interval_is_half_the_period_for_this_process_only() {
        let w = |u, p| watchdog_interval(u, p, 42);
        assert_eq!(w(None, None).unwrap(), None);
        assert_eq!(
            w(Some("4000000"), None).unwrap(),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            w(Some("4000000"), Some("42")).unwrap(),
            Some(Duration::from_secs(2))
        );
        assert_eq!(w(Some("4000000"), Some("7")).unwrap(), None);
        assert!(w(Some("0"), None).is_err());
        assert!(w(Some("soon"), None).is_err());
    }
}
