//! The tcpSocket probe: success when a TCP connection can be opened within the timeout
//! (upstream `pkg/probe/tcp`). The connection is closed right away.

use std::time::Duration;

use tokio::net::TcpStream;

use crate::outcome::ProbeOutcome;

/// `host:port` with IPv6 literals bracketed (Go's `net.JoinHostPort`).
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Opens a TCP connection, mapping errors to Go-like `dial tcp` messages.
pub(crate) async fn dial(addr: &str, timeout: Duration) -> Result<TcpStream, String> {
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(format!("dial tcp {addr}: connect: {}", io_error_text(&e))),
        Err(_) => Err(format!("dial tcp {addr}: i/o timeout")),
    }
}

/// Lower-case error text without Rust's "(os error N)" suffix, closer to Go's messages.
pub(crate) fn io_error_text(e: &std::io::Error) -> String {
    let s = e.to_string();
    let s = match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    };
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().collect::<String>() + c.as_str(),
        None => s,
    }
}

/// Runs a tcpSocket probe against `host:port`.
pub async fn probe(host: &str, port: u16, timeout: Duration) -> ProbeOutcome {
    let addr = join_host_port(host, port);
    match dial(&addr, timeout).await {
        Ok(stream) => {
            drop(stream);
            ProbeOutcome::success("")
        }
        Err(msg) => ProbeOutcome::failure(msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::ProbeResult;

    #[tokio::test]
    async fn listening_port_is_success() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let o = probe("127.0.0.1", port, Duration::from_secs(1)).await;
        assert_eq!(o, ProbeOutcome::success(""));
    }

    #[tokio::test]
    async fn closed_port_is_failure() {
        // Bind then drop to get a port that is (very likely) closed.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let o = probe("127.0.0.1", port, Duration::from_secs(1)).await;
        assert_eq!(o.result, ProbeResult::Failure);
        assert_eq!(
            o.output,
            format!("dial tcp 127.0.0.1:{port}: connect: connection refused")
        );
    }

    #[test]
    fn joins_ipv6() {
        assert_eq!(join_host_port("fd00::1", 80), "[fd00::1]:80");
        assert_eq!(join_host_port("10.0.0.1", 80), "10.0.0.1:80");
    }
}
