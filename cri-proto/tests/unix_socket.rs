//! End-to-end tests: a fake CRI runtime served on a unix socket, reached through `connect`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cri_proto::v1;
use cri_proto::{Error, ImageService, RuntimeService};
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::codegen::BoxStream;
use tonic::{Code, Request, Response, Status};

const TIMEOUT: Duration = Duration::from_secs(5);
/// Label key that makes the fake pad its ListContainers answer to N KiB.
const PAD_KIB: &str = "test.pad-kib";

#[derive(Clone)]
struct FakeRuntime {
    containers: Vec<v1::Container>,
}

fn container(id: &str, name: &str, state: v1::ContainerState) -> v1::Container {
    v1::Container {
        id: id.into(),
        pod_sandbox_id: "pod-1".into(),
        metadata: Some(v1::ContainerMetadata {
            name: name.into(),
            attempt: 2,
        }),
        image: Some(v1::ImageSpec {
            image: "busybox:1.35".into(),
            ..Default::default()
        }),
        state: state as i32,
        created_at: 1_700_000_000_000_000_000,
        ..Default::default()
    }
}

fn fake() -> FakeRuntime {
    FakeRuntime {
        containers: vec![
            container("c1", "app", v1::ContainerState::ContainerRunning),
            container("c2", "sidecar", v1::ContainerState::ContainerExited),
        ],
    }
}

/// `n` containers each carrying a 1 KiB label, for roughly `n` KiB on the wire.
fn padded(n: usize) -> Vec<v1::Container> {
    let blob = "x".repeat(1024);
    (0..n)
        .map(|i| {
            let mut c = container(
                &format!("pad-{i}"),
                "pad",
                v1::ContainerState::ContainerRunning,
            );
            c.labels.insert("blob".into(), blob.clone());
            c
        })
        .collect()
}

#[tonic::async_trait]
impl RuntimeService for FakeRuntime {
    async fn version(
        &self,
        req: Request<v1::VersionRequest>,
    ) -> Result<Response<v1::VersionResponse>, Status> {
        Ok(Response::new(v1::VersionResponse {
            version: req.into_inner().version,
            runtime_name: "fake".into(),
            runtime_version: "0.0.1".into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn list_containers(
        &self,
        req: Request<v1::ListContainersRequest>,
    ) -> Result<Response<v1::ListContainersResponse>, Status> {
        let filter = req.into_inner().filter.unwrap_or_default();
        if let Some(kib) = filter.label_selector.get(PAD_KIB) {
            let kib: usize = kib.parse().map_err(|_| Status::invalid_argument("pad"))?;
            return Ok(Response::new(v1::ListContainersResponse {
                containers: padded(kib),
            }));
        }
        let containers = self
            .containers
            .iter()
            .filter(|c| filter.state.as_ref().is_none_or(|s| s.state == c.state))
            .filter(|c| filter.id.is_empty() || filter.id == c.id)
            .cloned()
            .collect();
        Ok(Response::new(v1::ListContainersResponse { containers }))
    }

    async fn stream_containers(
        &self,
        _req: Request<v1::StreamContainersRequest>,
    ) -> Result<Response<BoxStream<v1::StreamContainersResponse>>, Status> {
        // One container per message.
        let chunks: Vec<Result<v1::StreamContainersResponse, Status>> = self
            .containers
            .iter()
            .map(|c| {
                Ok(v1::StreamContainersResponse {
                    containers: vec![c.clone()],
                })
            })
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks))))
    }

    async fn update_container_resources(
        &self,
        req: Request<v1::UpdateContainerResourcesRequest>,
    ) -> Result<Response<v1::UpdateContainerResourcesResponse>, Status> {
        let total: usize = req.into_inner().annotations.values().map(String::len).sum();
        if total == 0 {
            return Err(Status::invalid_argument("no annotations"));
        }
        Ok(Response::new(v1::UpdateContainerResourcesResponse {}))
    }
}

struct FakeImages;

#[tonic::async_trait]
impl ImageService for FakeImages {
    async fn list_images(
        &self,
        _req: Request<v1::ListImagesRequest>,
    ) -> Result<Response<v1::ListImagesResponse>, Status> {
        Ok(Response::new(v1::ListImagesResponse {
            images: vec![v1::Image {
                id: "sha256:abc".into(),
                repo_tags: vec!["docker.io/library/busybox:1.35".into()],
                size: 1_234_567,
                ..Default::default()
            }],
        }))
    }
}

struct Server {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Server {
    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(TIMEOUT, &mut self.task)
            .await
            .expect("server did not stop")
            .expect("server task panicked");
    }
}

fn serve(path: &Path) -> Server {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).expect("bind");
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(cri_proto::runtime_server(fake()))
            .add_service(cri_proto::image_server(FakeImages))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = rx.await;
            })
            .await
            .expect("serve");
    });
    Server {
        stop: Some(tx),
        task,
    }
}

fn sock(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("cri.sock")
}

#[tokio::test]
async fn version_and_list_containers() {
    let dir = tempfile::tempdir().unwrap();
    let path = sock(&dir);
    let server = serve(&path);
    assert!(cri_proto::is_socket(&path));
    assert!(
        !cri_proto::is_socket(dir.path()),
        "a directory is not a socket"
    );

    let ch = cri_proto::connect(&format!("unix://{}", path.display()), TIMEOUT)
        .await
        .expect("connect");
    let mut rt = cri_proto::runtime_client(ch.clone());

    let v = rt
        .version(v1::VersionRequest {
            version: cri_proto::CRI_API_VERSION.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v.runtime_name, "fake");
    assert_eq!(v.runtime_version, "0.0.1");
    assert_eq!(v.runtime_api_version, "v1");
    assert_eq!(v.version, "v1", "request field must round-trip");

    let all = rt
        .list_containers(v1::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers;
    let ids: Vec<_> = all.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["c1", "c2"]);
    assert_eq!(all[0].metadata.as_ref().unwrap().name, "app");
    assert_eq!(all[0].metadata.as_ref().unwrap().attempt, 2);
    assert_eq!(all[1].state(), v1::ContainerState::ContainerExited);
    assert_eq!(all[0].image.as_ref().unwrap().image, "busybox:1.35");

    // The filter travels to the server.
    let running = rt
        .list_containers(v1::ListContainersRequest {
            filter: Some(v1::ContainerFilter {
                state: Some(v1::ContainerStateValue {
                    state: v1::ContainerState::ContainerRunning as i32,
                }),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert_eq!(running.len(), 1);
    assert_eq!(running[0].id, "c1");

    let images = cri_proto::image_client(ch)
        .list_images(v1::ListImagesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .images;
    assert_eq!(images.len(), 1);
    assert_eq!(images[0].repo_tags, ["docker.io/library/busybox:1.35"]);
    assert_eq!(images[0].size, 1_234_567);

    server.shutdown().await;
}

#[tokio::test]
async fn all_endpoint_spellings_connect() {
    let dir = tempfile::tempdir().unwrap();
    let path = sock(&dir);
    let server = serve(&path);
    for ep in [
        format!("unix://{}", path.display()),
        format!("unix:{}", path.display()),
        path.display().to_string(),
    ] {
        let ch = cri_proto::connect(&ep, TIMEOUT).await.expect(&ep);
        let v = cri_proto::runtime_client(ch)
            .version(v1::VersionRequest::default())
            .await
            .expect(&ep);
        assert_eq!(v.into_inner().runtime_name, "fake", "{ep}");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn missing_socket_is_an_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.sock");
    assert!(!cri_proto::is_socket(&path));
    let ep = format!("unix://{}", path.display());
    let err = cri_proto::connect(&ep, TIMEOUT)
        .await
        .expect_err("no socket there");
    assert!(matches!(err, Error::Transport { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("No such file"), "{msg}");
}

#[tokio::test]
async fn tcp_endpoint_is_rejected() {
    let err = cri_proto::connect("tcp://127.0.0.1:1", TIMEOUT)
        .await
        .expect_err("tcp unsupported");
    assert!(matches!(err, Error::BadEndpoint { .. }), "{err:?}");
    assert!(err.to_string().contains("tcp://127.0.0.1:1"), "{err}");
}

#[tokio::test]
async fn lazy_connect_defers_dialing() {
    let dir = tempfile::tempdir().unwrap();
    let path = sock(&dir);
    // The socket does not exist yet: building the channel still succeeds.
    let ch = cri_proto::connect_lazy(&format!("unix://{}", path.display()), TIMEOUT).unwrap();
    let mut rt = cri_proto::runtime_client(ch);
    let status = rt
        .version(v1::VersionRequest::default())
        .await
        .expect_err("nothing listening");
    assert_eq!(status.code(), Code::Unavailable, "{status}");

    let server = serve(&path);
    let v = retry_version(&mut rt).await;
    assert_eq!(v.runtime_name, "fake");
    server.shutdown().await;
}

async fn retry_version(
    rt: &mut cri_proto::RuntimeServiceClient<cri_proto::Channel>,
) -> v1::VersionResponse {
    let mut last = None;
    for _ in 0..50 {
        match rt.version(v1::VersionRequest::default()).await {
            Ok(v) => return v.into_inner(),
            Err(s) => {
                assert_eq!(s.code(), Code::Unavailable, "{s}");
                last = Some(s);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never reconnected: {last:?}");
}

#[tokio::test]
async fn channel_reconnects_after_runtime_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = sock(&dir);
    let server = serve(&path);
    let ch = cri_proto::connect(&format!("unix://{}", path.display()), TIMEOUT)
        .await
        .unwrap();
    let mut rt = cri_proto::runtime_client(ch);
    rt.version(v1::VersionRequest::default()).await.unwrap();

    server.shutdown().await;
    std::fs::remove_file(&path).unwrap();
    let down = rt.version(v1::VersionRequest::default()).await;
    assert_eq!(down.expect_err("runtime is down").code(), Code::Unavailable);

    let server = serve(&path);
    assert_eq!(retry_version(&mut rt).await.runtime_name, "fake");
    server.shutdown().await;
}

#[tokio::test]
async fn messages_between_4_and_16_mib_pass() {
    let dir = tempfile::tempdir().unwrap();
    let path = sock(&dir);
    let server = serve(&path);
    let ch = cri_proto::connect(&format!("unix://{}", path.display()), TIMEOUT)
        .await
        .unwrap();

    let padded_req = |kib: usize| v1::ListContainersRequest {
        filter: Some(v1::ContainerFilter {
            label_selector: HashMap::from([(PAD_KIB.to_string(), kib.to_string())]),
            ..Default::default()
        }),
    };

    // ~8 MiB response: fine with our client.
    let big = cri_proto::runtime_client(ch.clone())
        .list_containers(padded_req(8 * 1024))
        .await
        .expect("8 MiB response must pass")
        .into_inner();
    assert_eq!(big.containers.len(), 8 * 1024);
    assert_eq!(big.containers[100].labels["blob"].len(), 1024);

    // The same answer breaks tonic's default 4 MiB limit, so the setting matters.
    let err = cri_proto::RuntimeServiceClient::new(ch.clone())
        .list_containers(padded_req(8 * 1024))
        .await
        .expect_err("default client limit is 4 MiB");
    assert_eq!(err.code(), Code::OutOfRange, "{err}");

    // Over 16 MiB is refused.
    let err = cri_proto::runtime_client(ch.clone())
        .list_containers(padded_req(17 * 1024))
        .await
        .expect_err("17 MiB is over the limit");
    assert!(
        matches!(err.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{err}"
    );

    // ~6 MiB request: the server side accepts it too.
    let annotations = HashMap::from([("big".to_string(), "y".repeat(6 << 20))]);
    cri_proto::runtime_client(ch)
        .update_container_resources(v1::UpdateContainerResourcesRequest {
            container_id: "c1".into(),
            annotations,
            ..Default::default()
        })
        .await
        .expect("6 MiB request must pass");

    server.shutdown().await;
}

#[tokio::test]
async fn unimplemented_rpcs_and_streams() {
    let dir = tempfile::tempdir().unwrap();
    let path = sock(&dir);
    let server = serve(&path);
    let ch = cri_proto::connect(&format!("unix://{}", path.display()), TIMEOUT)
        .await
        .unwrap();
    let mut rt = cri_proto::runtime_client(ch.clone());

    // Default stubs answer UNIMPLEMENTED, as containerd 1.6 does for RuntimeConfig.
    let err = rt
        .runtime_config(v1::RuntimeConfigRequest {})
        .await
        .expect_err("not implemented by the fake");
    assert_eq!(err.code(), Code::Unimplemented);
    let err = cri_proto::image_client(ch)
        .image_fs_info(v1::ImageFsInfoRequest {})
        .await
        .expect_err("not implemented by the fake");
    assert_eq!(err.code(), Code::Unimplemented);

    // Server-streaming list: one container per message, then EOF.
    let mut stream = rt
        .stream_containers(v1::StreamContainersRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut chunks = Vec::new();
    while let Some(msg) = stream.message().await.unwrap() {
        chunks.push(
            msg.containers
                .iter()
                .map(|c| c.id.clone())
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(chunks, [vec!["c1".to_string()], vec!["c2".to_string()]]);

    // A stubbed streaming RPC fails at call time.
    let err = rt
        .get_container_events(v1::GetEventsRequest {})
        .await
        .expect_err("not implemented by the fake");
    assert_eq!(err.code(), Code::Unimplemented);

    server.shutdown().await;
}

#[tokio::test]
async fn cri_binary_lists_objects() {
    let dir = tempfile::tempdir().unwrap();
    let path = sock(&dir);
    let server = serve(&path);
    let ep = format!("unix://{}", path.display());
    let run = |args: &'static [&'static str]| {
        let ep = ep.clone();
        async move {
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_cri"))
                .arg("--endpoint")
                .arg(&ep)
                .args(args)
                .env_remove("CONTAINER_RUNTIME_ENDPOINT")
                .output()
                .await
                .expect("run cri");
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        }
    };

    assert_eq!(run(&["version"]).await, "fake\t0.0.1\tv1\n");
    assert_eq!(
        run(&["ps"]).await,
        "c1\tapp\tCONTAINER_RUNNING\t2\tpod-1\tbusybox:1.35\n"
    );
    assert_eq!(run(&["ps", "-a", "-q"]).await, "c1\nc2\n");
    assert_eq!(
        run(&["images"]).await,
        "sha256:abc\tdocker.io/library/busybox:1.35\t1234567\n"
    );
    // ListPodSandbox is not implemented by the fake: non-zero exit.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_cri"))
        .args(["--endpoint", &ep, "pods"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ListPodSandbox"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    server.shutdown().await;
}
