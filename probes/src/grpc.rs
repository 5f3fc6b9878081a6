//! The grpc probe: `grpc.health.v1.Health/Check` over plaintext HTTP/2 (upstream
//! `pkg/probe/grpc`). `SERVING` is success; every other answer or error is a failure with a
//! message, as upstream does ("to mimic grpc_health_probe").

use std::time::Duration;

use crate::outcome::ProbeOutcome;
use crate::tcp::join_host_port;
use plumbing::duration::format as go_duration;

/// The generated `grpc.health.v1` types, client and server.
pub mod health {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("grpc.health.v1");
}

use health::HealthCheckRequest;
use health::health_check_response::ServingStatus;
use health::health_client::HealthClient;

/// Runs a grpc probe against `host:port`, asking about `service` ("" = the whole server).
pub async fn probe(host: &str, port: u16, service: &str, timeout: Duration) -> ProbeOutcome {
    let addr = join_host_port(host, port);
    let mut connected = false;
    let attempt = tokio::time::timeout(timeout, async {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .and_then(|e| e.user_agent(crate::probe_user_agent()))
            .map(|e| e.connect_timeout(timeout));
        let endpoint = match endpoint {
            Ok(e) => e,
            Err(e) => {
                return ProbeOutcome::failure(format!(
                    "error: failed to connect service at {addr:?}: {}",
                    error_chain(&e)
                ));
            }
        };
        let channel = match endpoint.connect().await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(addr, service, error = %error_chain(&e), "failed to connect grpc service");
                return ProbeOutcome::failure(format!(
                    "error: failed to connect service at {addr:?}: {}",
                    error_chain(&e)
                ));
            }
        };
        connected = true;
        let mut client = HealthClient::new(channel);
        let request = HealthCheckRequest {
            service: service.to_string(),
        };
        match client.check(request).await {
            Ok(resp) => {
                let raw = resp.into_inner().status;
                match ServingStatus::try_from(raw) {
                    Ok(ServingStatus::Serving) => ProbeOutcome::success("service healthy"),
                    Ok(other) => ProbeOutcome::failure(format!(
                        "service unhealthy (responded with {:?})",
                        other.as_str_name()
                    )),
                    Err(_) => ProbeOutcome::failure(format!(
                        "service unhealthy (responded with \"{raw}\")"
                    )),
                }
            }
            Err(status) => match status.code() {
                tonic::Code::Unimplemented => ProbeOutcome::failure(format!(
                    "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                    status.message()
                )),
                tonic::Code::DeadlineExceeded => ProbeOutcome::failure(format!(
                    "timeout: health rpc did not complete within {}",
                    go_duration(timeout)
                )),
                code => {
                    tracing::debug!(addr, service, ?code, message = status.message(), "grpc health rpc failed");
                    ProbeOutcome::failure(format!(
                        "error: health rpc probe failed: rpc error: code = {code:?} desc = {}",
                        status.message()
                    ))
                }
            },
        }
    })
    .await;
    match attempt {
        Ok(outcome) => outcome,
        Err(_) if !connected => ProbeOutcome::failure(format!(
            "timeout: failed to connect service {addr:?} within {}: context deadline exceeded",
            go_duration(timeout)
        )),
        Err(_) => ProbeOutcome::failure(format!(
            "timeout: health rpc did not complete within {}",
            go_duration(timeout)
        )),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}
