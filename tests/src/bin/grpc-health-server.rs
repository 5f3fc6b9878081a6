//! A tiny `grpc.health.v1.Health` server for the grpc probe e2e tests (packaged as the offline
//! image `registry.local/grpc-health:1` by `tests/rig/build-test-images.sh`).
//!
//! ```text
//! grpc-health-server [--port 9090] [--serving-file PATH] [--toggle-every SECS]
//! ```
//!
//! The status answered for every service name is:
//! - with `--serving-file PATH`: SERVING while PATH exists, NOT_SERVING otherwise (checked on
//!   every request);
//! - with `--toggle-every SECS`: SERVING for SECS seconds from start, then NOT_SERVING for SECS
//!   seconds, and so on;
//! - with neither: SERVING.
//!
//! Exits 0 on SIGTERM/SIGINT (it runs as PID 1 in its container).

use probes::grpc::health::health_check_response::ServingStatus;
use probes::grpc::health::health_server::{Health, HealthServer};
use probes::grpc::health::{HealthCheckRequest, HealthCheckResponse};
use std::path::PathBuf;
use std::pin::Pin;
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

#[derive(Debug, Clone)]
struct Config {
    port: u16,
    serving_file: Option<PathBuf>,
    toggle_every: Option<Duration>,
}

fn usage() -> ! {
    eprintln!("usage: grpc-health-server [--port N] [--serving-file PATH] [--toggle-every SECS]");
    std::process::exit(2)
}

fn parse_args() -> Config {
    let mut c = Config {
        port: 9090,
        serving_file: None,
        toggle_every: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (a.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .unwrap_or_else(|| usage())
        };
        match flag.as_str() {
            "--port" => c.port = value().parse().unwrap_or_else(|_| usage()),
            "--serving-file" => c.serving_file = Some(value().into()),
            "--toggle-every" => {
                let s: f64 = value().parse().unwrap_or_else(|_| usage());
                if !(s > 0.0 && s.is_finite()) {
                    usage();
                }
                c.toggle_every = Some(Duration::from_secs_f64(s));
            }
            "-h" | "--help" => usage(),
            _ => usage(),
        }
    }
    c
}

struct Server {
    config: Config,
    started: Instant,
}

impl Server {
    fn status(&self) -> ServingStatus {
        if let Some(f) = &self.config.serving_file
            && !f.exists()
        {
            return ServingStatus::NotServing;
        }
        if let Some(period) = self.config.toggle_every {
            let n = self.started.elapsed().as_nanos() / period.as_nanos().max(1);
            if n % 2 == 1 {
                return ServingStatus::NotServing;
            }
        }
        ServingStatus::Serving
    }
}

type WatchStream =
    Pin<Box<dyn futures::Stream<Item = Result<HealthCheckResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Health for Server {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let status = self.status();
        eprintln!(
            "check service={:?} -> {}",
            request.get_ref().service,
            status.as_str_name()
        );
        Ok(Response::new(HealthCheckResponse {
            status: status as i32,
        }))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        _request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("watch is not implemented"))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let config = parse_args();
    let addr = std::net::SocketAddr::from(([0, 0, 0, 0], config.port));
    eprintln!("grpc-health-server listening on {addr} ({config:?})");
    let server = Server {
        config,
        started: Instant::now(),
    };
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        eprintln!("grpc-health-server: shutting down");
    };
    if let Err(e) = tonic::transport::Server::builder()
        .add_service(HealthServer::new(server))
        .serve_with_shutdown(addr, shutdown)
        .await
    {
        eprintln!("grpc-health-server: {e}");
        std::process::exit(1);
    }
}
