//! `cri`: a tiny crictl for operators and rig scripts (version, status, pods, ps, images).

use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use cri_proto::v1;

#[derive(Parser, Debug)]
#[command(name = "cri", about = "Query a CRI v1 runtime over its unix socket")]
struct Cli {
    /// Runtime endpoint: unix:///path, unix:/path or /path.
    #[arg(
        long,
        short = 'r',
        env = "CONTAINER_RUNTIME_ENDPOINT",
        default_value = "unix:///run/containerd/containerd.sock"
    )]
    endpoint: String,
    /// Connect and per-call timeout, in seconds.
    #[arg(long, default_value_t = 10)]
    timeout: u64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Runtime name, version and CRI API version.
    Version,
    /// Runtime conditions (type status reason message).
    Status,
    /// Pod sandboxes: id namespace/name state attempt.
    Pods {
        /// Print ids only.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Containers: id name state attempt pod-id image.
    Ps {
        /// Include containers that are not running.
        #[arg(short, long)]
        all: bool,
        /// Print ids only.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Images: id tags size.
    Images {
        /// Print ids only.
        #[arg(short, long)]
        quiet: bool,
    },
}

fn request<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(timeout);
    req
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cri: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    let timeout = Duration::from_secs(cli.timeout.max(1));
    let ch = cri_proto::connect(&cli.endpoint, timeout).await?;
    let mut rt = cri_proto::runtime_client(ch.clone());
    let mut img = cri_proto::image_client(ch);

    match cli.cmd {
        Cmd::Version => {
            let v = rt
                .version(request(
                    v1::VersionRequest {
                        version: cri_proto::CRI_API_VERSION.into(),
                    },
                    timeout,
                ))
                .await
                .context("Version")?
                .into_inner();
            println!(
                "{}\t{}\t{}",
                v.runtime_name, v.runtime_version, v.runtime_api_version
            );
        }
        Cmd::Status => {
            let s = rt
                .status(request(v1::StatusRequest { verbose: false }, timeout))
                .await
                .context("Status")?
                .into_inner();
            for c in s.status.map(|s| s.conditions).unwrap_or_default() {
                println!(
                    "{}\t{}\t{}\t{}",
                    c.r#type,
                    c.status,
                    or_dash(&c.reason),
                    or_dash(&c.message)
                );
            }
        }
        Cmd::Pods { quiet } => {
            let items = rt
                .list_pod_sandbox(request(v1::ListPodSandboxRequest::default(), timeout))
                .await
                .context("ListPodSandbox")?
                .into_inner()
                .items;
            for p in items {
                if quiet {
                    println!("{}", p.id);
                    continue;
                }
                let md = p.metadata.clone().unwrap_or_default();
                println!(
                    "{}\t{}/{}\t{}\t{}",
                    p.id,
                    md.namespace,
                    md.name,
                    p.state().as_str_name(),
                    md.attempt
                );
            }
        }
        Cmd::Ps { all, quiet } => {
            let filter = (!all).then(|| v1::ContainerFilter {
                state: Some(v1::ContainerStateValue {
                    state: v1::ContainerState::ContainerRunning as i32,
                }),
                ..Default::default()
            });
            let containers = rt
                .list_containers(request(v1::ListContainersRequest { filter }, timeout))
                .await
                .context("ListContainers")?
                .into_inner()
                .containers;
            for c in containers {
                if quiet {
                    println!("{}", c.id);
                    continue;
                }
                let md = c.metadata.clone().unwrap_or_default();
                let image = c.image.as_ref().map(|i| i.image.as_str()).unwrap_or("");
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}",
                    c.id,
                    md.name,
                    c.state().as_str_name(),
                    md.attempt,
                    c.pod_sandbox_id,
                    or_dash(image)
                );
            }
        }
        Cmd::Images { quiet } => {
            let images = img
                .list_images(request(v1::ListImagesRequest::default(), timeout))
                .await
                .context("ListImages")?
                .into_inner()
                .images;
            for i in images {
                if quiet {
                    println!("{}", i.id);
                    continue;
                }
                let tags = if i.repo_tags.is_empty() {
                    "<none>".to_string()
                } else {
                    i.repo_tags.join(",")
                };
                println!("{}\t{}\t{}", i.id, tags, i.size);
            }
        }
    }
    Ok(())
}
