//! systemd integration: readiness notification and the unit files that run the node agent.
//!
//! `notify_ready` speaks the sd_notify datagram protocol directly: one `READY=1` message to
//! the socket named by `NOTIFY_SOCKET`. Without that variable (not started by systemd with
//! `Type=notify`) it does nothing.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (e.g. `READY=1`) to systemd. Returns whether a message was sent.
pub fn notify(state: &str) -> std::io::Result<bool> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let path = path.to_string_lossy().into_owned();
    // Abstract sockets ('@name') are not reachable through std's path API; skip them.
    if path.starts_with('@') {
        return Ok(false);
    }
    let sock = UnixDatagram::unbound()?;
    sock.send_to(state.as_bytes(), &path)?;
    Ok(true)
}

/// Reports readiness, logging nothing on failure (systemd may not be listening).
pub fn notify_ready() {
    let _ = notify("READY=1");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_ready_to_the_notify_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        // SAFETY-free: set_var is unsafe in edition 2024, so the sender is exercised directly.
        let sock = UnixDatagram::unbound().unwrap();
        sock.send_to(b"READY=1", &path).unwrap();
        let mut buf = [0u8; 16];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        // Without NOTIFY_SOCKET in this test process, notify is a no-op.
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            assert!(!notify("READY=1").unwrap());
        }
    }
}
