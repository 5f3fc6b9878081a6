//! tcpSocket and grpc runners against local listeners on 127.0.0.1.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use probes::grpc::health::health_check_response::ServingStatus;
use probes::grpc::health::health_server::{Health, HealthServer};
use probes::grpc::health::{HealthCheckRequest, HealthCheckResponse};
use probes::{ProbeOutcome, ProbeResult};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// A health service answering from a fixed table; records the service names asked about and
/// the user agent.
#[derive(Default, Clone)]
struct FakeHealth {
    statuses: HashMap<String, ServingStatus>,
    asked: Arc<Mutex<Vec<(String, String)>>>,
}

#[tonic::async_trait]
impl Health for FakeHealth {
    async fn check(
        &self,
        req: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let ua = req
            .metadata()
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let service = req.into_inner().service;
        self.asked.lock().unwrap().push((service.clone(), ua));
        match self.statuses.get(&service) {
            Some(s) => Ok(Response::new(HealthCheckResponse { status: *s as i32 })),
            None => Err(Status::not_found("unknown service")),
        }
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

    async fn watch(
        &self,
        _req: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("watch"))
    }
}

async fn grpc_server(h: FakeHealth) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(HealthServer::new(h))
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    port
}

fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

const T: Duration = Duration::from_secs(5);

#[tokio::test]
async fn tcp_open_and_closed() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    assert_eq!(
        probes::tcp::probe("127.0.0.1", port, T).await,
        ProbeOutcome::success("")
    );
    drop(listener);
    let o = probes::tcp::probe("127.0.0.1", closed_port(), T).await;
    assert_eq!(o.result, ProbeResult::Failure);
    assert!(o.output.contains("connection refused"), "{}", o.output);
}

#[tokio::test]
async fn grpc_serving_not_serving_and_service_name() {
    let h = FakeHealth {
        statuses: HashMap::from([
            (String::new(), ServingStatus::Serving),
            ("db".to_string(), ServingStatus::NotServing),
            ("cache".to_string(), ServingStatus::Serving),
        ]),
        ..Default::default()
    };
    let asked = h.asked.clone();
    let port = grpc_server(h).await;

    let o = probes::grpc::probe("127.0.0.1", port, "", T).await;
    assert_eq!(o, ProbeOutcome::success("service healthy"));

    let o = probes::grpc::probe("127.0.0.1", port, "db", T).await;
    assert_eq!(
        o,
        ProbeOutcome::failure("service unhealthy (responded with \"NOT_SERVING\")")
    );

    let o = probes::grpc::probe("127.0.0.1", port, "cache", T).await;
    assert_eq!(o.result, ProbeResult::Success);

    let o = probes::grpc::probe("127.0.0.1", port, "nope", T).await;
    assert_eq!(
        o,
        ProbeOutcome::failure(
            "error: health rpc probe failed: rpc error: code = NotFound desc = unknown service"
        )
    );

    let asked = asked.lock().unwrap();
    let services: Vec<&str> = asked.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(services, ["", "db", "cache", "nope"]);
    assert!(asked[0].1.starts_with("kube-probe/1.36"), "{}", asked[0].1);
}

#[tokio::test]
async fn grpc_connection_failure_is_failure() {
    let port = closed_port();
    let o = probes::grpc::probe("127.0.0.1", port, "", T).await;
    assert_eq!(o.result, ProbeResult::Failure);
    assert!(
        o.output.starts_with(&format!(
            "error: failed to connect service at \"127.0.0.1:{port}\""
        )),
        "{}",
        o.output
    );
}

#[tokio::test]
async fn grpc_timeout_is_failure() {
    // A listener that accepts but never speaks HTTP/2: the RPC cannot complete.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (s, _) = listener.accept().await.unwrap();
            held.push(s);
        }
    });
    let o = probes::grpc::probe("127.0.0.1", port, "", Duration::from_millis(300)).await;
    assert_eq!(o.result, ProbeResult::Failure);
    assert!(o.output.starts_with("timeout: "), "{}", o.output);
}
