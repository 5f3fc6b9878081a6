//! The CRI client through the wire: [`CriRuntime`] against `cri_proto::fake::FakeCri`, a tonic
//! server on a unix socket that records each request (with its deadline), keeps sandboxes,
//! containers and images, and fails or stalls a method when told to.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use cri_proto::fake::FakeCri;
use tonic::Code;

use super::*;
use crate::runtime::raw;

const TIMEOUT: Duration = Duration::from_secs(4);

async fn client(fake: &FakeCri, timeout: Duration) -> CriRuntime {
    let ch = cri_proto::connect(fake.endpoint(), Duration::from_secs(5))
        .await
        .expect("connect to the fake runtime");
    CriRuntime::new(ch.clone(), ch, timeout)
}

async fn started() -> (FakeCri, CriRuntime) {
    let fake = FakeCri::start().await.expect("fake CRI server");
    fake.with_state(|s| s.add_image(raw::IMAGE, 4 << 20));
    let rt = client(&fake, TIMEOUT).await;
    (fake, rt)
}

fn pod(i: usize) -> SandboxConfig {
    raw::sandbox(
        i,
        "wire",
        std::path::Path::new("/var/log/pods"),
        "/kubepods",
    )
}

/// A pod with one running container; (sandbox id, container id).
async fn run_pod(rt: &CriRuntime, sb: &SandboxConfig) -> (String, String) {
    let sid = rt.run_sandbox(sb).await.unwrap();
    let cid = rt
        .create_container(&sid, &raw::container(sb), sb)
        .await
        .unwrap();
    rt.start_container(&cid).await.unwrap();
    (sid, cid)
}

fn close(a: Option<Duration>, b: Duration) -> bool {
    a.is_some_and(|a| a.abs_diff(b) <= Duration::from_millis(50))
}

#[tokio::test]
async fn version_asks_for_v1_and_reports_the_runtimes_answer() {
    let (fake, rt) = started().await;
    fake.with_state(|s| {
        s.version.runtime_name = "containerd".into();
        s.version.runtime_version = "v1.6.20".into();
    });
    let v = rt.version().await.unwrap();
    assert_eq!(
        (
            v.runtime_name.as_str(),
            v.runtime_version.as_str(),
            v.runtime_api_version.as_str()
        ),
        ("containerd", "v1.6.20", "v1")
    );
    let sent: Vec<pb::VersionRequest> = fake.requests("Version");
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].version, "v1");
}

/// A runtime that does not speak CRI v1 answers Version with UNIMPLEMENTED: a call error
/// naming the code; one that is down is "unavailable" (the kubelet waits for it).
#[tokio::test]
async fn version_errors_say_unimplemented_or_unavailable() {
    let (fake, rt) = started().await;
    fake.fail(
        "Version",
        Code::Unimplemented,
        "unknown service runtime.v1.RuntimeService",
    );
    let e = rt.version().await.unwrap_err();
    assert!(
        matches!(&e, RuntimeError::Call { op: "Version", message } if message.contains("Unimplemented") && message.contains("runtime.v1.RuntimeService")),
        "{e:?}"
    );
    fake.fail("Version", Code::Unavailable, "connection refused");
    let e = rt.version().await.unwrap_err();
    assert!(
        matches!(&e, RuntimeError::Unavailable(m) if m == "Version: connection refused"),
        "{e:?}"
    );
    fake.clear("Version");
    assert_eq!(rt.version().await.unwrap().runtime_api_version, "v1");
}

#[tokio::test]
async fn not_found_answers_become_not_found_errors() {
    let (fake, rt) = started().await;
    let e = rt.container_status("gone").await.unwrap_err();
    assert!(
        matches!(&e, RuntimeError::NotFound { op: "ContainerStatus", message } if message.contains("gone")),
        "{e:?}"
    );
    let e = rt.sandbox_status("gone").await.unwrap_err();
    assert!(
        matches!(
            e,
            RuntimeError::NotFound {
                op: "PodSandboxStatus",
                ..
            }
        ),
        "{e:?}"
    );
    // Stopping and removing what is already gone succeed (the CRI's idempotence).
    rt.stop_sandbox("gone").await.unwrap();
    rt.remove_sandbox("gone").await.unwrap();
    rt.remove_container("gone").await.unwrap();
    // Any other code is a call error that names the method and the code.
    let sb = pod(0);
    let sid = rt.run_sandbox(&sb).await.unwrap();
    let cid = rt
        .create_container(&sid, &raw::container(&sb), &sb)
        .await
        .unwrap();
    fake.fail_times(
        "StartContainer",
        1,
        Code::Internal,
        "runc: exec format error",
    );
    let e = rt.start_container(&cid).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "StartContainer failed: Internal: runc: exec format error"
    );
    // Only once: the next start goes through.
    rt.start_container(&cid).await.unwrap();
}

/// Every call carries the configured deadline; a runtime slower than it costs the caller
/// the deadline, not the runtime's time.
#[tokio::test]
async fn a_stalled_runtime_costs_the_deadline_not_more() {
    let fake = FakeCri::start().await.unwrap();
    let rt = client(&fake, Duration::from_millis(300)).await;
    fake.delay("ListPodSandbox", Duration::from_secs(10));
    let t = Instant::now();
    let e = rt.list_sandboxes().await.unwrap_err();
    let took = t.elapsed();
    assert!(took < Duration::from_secs(3), "took {took:?}: {e}");
    assert!(
        matches!(&e, RuntimeError::Call { op: "ListPodSandbox", message } if message.starts_with("DeadlineExceeded") || message.starts_with("Cancelled")),
        "{e:?}"
    );
    let call = &fake.calls()[0];
    assert!(close(call.timeout, Duration::from_millis(300)), "{call:?}");
    fake.clear("ListPodSandbox");
    assert!(rt.list_sandboxes().await.unwrap().is_empty());
}

/// A pull slower than runtimeRequestTimeout (and than any fixed floor) is not cut: the
/// request carries no deadline and the answer comes when the runtime gives it.
#[tokio::test]
async fn a_pull_slower_than_the_request_timeout_is_not_cut() {
    let fake = FakeCri::start().await.unwrap();
    let rt = client(&fake, Duration::from_millis(200)).await;
    fake.delay("PullImage", Duration::from_millis(1500));
    let t = Instant::now();
    let image_ref = rt
        .pull_image("registry.local/big:1", None, &pod(0))
        .await
        .expect("a slow pull completes");
    assert!(
        t.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    assert!(!image_ref.is_empty());
    assert_eq!(fake.calls()[0].timeout, None, "{:?}", fake.calls()[0]);
    // Other calls keep runtimeRequestTimeout.
    fake.delay("ListPodSandbox", Duration::from_secs(10));
    assert!(rt.list_sandboxes().await.is_err());
}

/// Calls that last by design get more than the plain deadline: StopContainer its grace
/// period on top, ExecSync its own timeout on top; PullImage none at all (upstream's).
#[tokio::test]
async fn long_calls_get_longer_deadlines() {
    let (fake, rt) = started().await;
    let sb = pod(0);
    let (_, cid) = run_pod(&rt, &sb).await;
    rt.exec_sync(&cid, &["true".into()], Duration::from_secs(7))
        .await
        .unwrap();
    rt.stop_container(&cid, Duration::from_secs(30))
        .await
        .unwrap();
    rt.pull_image("registry.local/app:1", None, &sb)
        .await
        .unwrap();
    let deadline = |m: &str| {
        fake.calls()
            .into_iter()
            .find(|c| c.method == m)
            .unwrap()
            .timeout
    };
    assert!(close(deadline("RunPodSandbox"), TIMEOUT));
    assert!(close(
        deadline("ExecSync"),
        TIMEOUT + Duration::from_secs(7)
    ));
    assert!(close(
        deadline("StopContainer"),
        TIMEOUT + Duration::from_secs(30)
    ));
    assert_eq!(deadline("PullImage"), None, "a pull carries no deadline");
    let stop: Vec<pb::StopContainerRequest> = fake.requests("StopContainer");
    assert_eq!(
        (stop[0].container_id.as_str(), stop[0].timeout),
        (cid.as_str(), 30)
    );
    let exec: Vec<pb::ExecSyncRequest> = fake.requests("ExecSync");
    assert_eq!(
        (exec[0].cmd.clone(), exec[0].timeout),
        (vec!["true".to_string()], 7)
    );
}

/// What the pod spec put in the sandbox and container configs is what the runtime gets, and
/// what the runtime then lists.
#[tokio::test]
async fn pod_and_container_configs_reach_the_runtime_as_given() {
    let (fake, rt) = started().await;
    let mut sb = pod(0);
    sb.annotations.insert("example.com/a".into(), "1".into());
    sb.runtime_handler = "kata".into();
    sb.port_mappings = vec![PortMapping {
        protocol: Protocol::Tcp,
        container_port: 80,
        host_port: 8080,
        host_ip: "127.0.0.1".into(),
    }];
    sb.dns = Some(DnsConfig {
        servers: vec!["10.96.0.10".into()],
        searches: vec!["default.svc.cluster.local".into()],
        options: vec!["ndots:5".into()],
    });
    let mut c = raw::container(&sb);
    c.envs = vec![("A".into(), "b".into())];
    (c.stdin, c.stdin_once, c.tty) = (true, true, true);
    c.annotations
        .insert("io.kubernetes.container.hash".into(), "abc".into());
    c.mounts = vec![
        Mount {
            container_path: "/data".into(),
            host_path: "/var/lib/kubelet/pods/x/volumes/d".into(),
            readonly: true,
            selinux_relabel: true,
            propagation: Propagation::Private,
            recursive_read_only: true,
            ..Default::default()
        },
        Mount {
            container_path: "/host".into(),
            host_path: "/srv".into(),
            propagation: Propagation::HostToContainer,
            ..Default::default()
        },
        Mount {
            container_path: "/shared".into(),
            host_path: "/mnt/shared".into(),
            propagation: Propagation::Bidirectional,
            ..Default::default()
        },
        Mount {
            container_path: "/tools".into(),
            readonly: true,
            image: Some("registry.example/tools:1".into()),
            image_sub_path: "bin".into(),
            ..Default::default()
        },
    ];
    let sid = rt.run_sandbox(&sb).await.unwrap();
    let cid = rt.create_container(&sid, &c, &sb).await.unwrap();

    let run: Vec<pb::RunPodSandboxRequest> = fake.requests("RunPodSandbox");
    assert_eq!(run[0].runtime_handler, "kata");
    let config = run[0].config.clone().unwrap();
    let md = config.metadata.clone().unwrap();
    assert_eq!(
        (md.name.as_str(), md.namespace.as_str(), md.uid.as_str()),
        (sb.name.as_str(), "default", sb.uid.as_str())
    );
    assert_eq!(config.labels, hash(&sb.labels));
    assert_eq!(config.annotations, hash(&sb.annotations));
    assert_eq!(config.hostname, sb.hostname);
    assert_eq!(config.log_directory, sb.log_directory);
    let pm = &config.port_mappings[0];
    assert_eq!(
        (pm.container_port, pm.host_port, pm.host_ip.as_str()),
        (80, 8080, "127.0.0.1")
    );
    let dns = config.dns_config.unwrap();
    assert_eq!(
        (dns.servers, dns.searches, dns.options),
        (
            vec!["10.96.0.10".to_string()],
            vec!["default.svc.cluster.local".to_string()],
            vec!["ndots:5".to_string()]
        )
    );
    assert_eq!(config.linux.unwrap().cgroup_parent, sb.cgroup_parent);

    let create: Vec<pb::CreateContainerRequest> = fake.requests("CreateContainer");
    assert_eq!(create[0].pod_sandbox_id, sid);
    assert_eq!(create[0].sandbox_config.as_ref(), run[0].config.as_ref());
    let cc = create[0].config.clone().unwrap();
    assert_eq!(cc.metadata.unwrap().name, "app");
    assert_eq!(cc.image.unwrap().image, raw::IMAGE);
    assert_eq!(cc.command, c.command);
    assert_eq!(cc.labels, hash(&c.labels));
    assert_eq!(cc.annotations, hash(&c.annotations));
    assert_eq!(
        (cc.envs[0].key.as_str(), cc.envs[0].value.as_str()),
        ("A", "b")
    );
    assert_eq!(
        cc.mounts,
        vec![
            pb::Mount {
                container_path: "/data".into(),
                host_path: "/var/lib/kubelet/pods/x/volumes/d".into(),
                readonly: true,
                selinux_relabel: true,
                propagation: pb::MountPropagation::PropagationPrivate as i32,
                recursive_read_only: true,
                ..Default::default()
            },
            pb::Mount {
                container_path: "/host".into(),
                host_path: "/srv".into(),
                propagation: pb::MountPropagation::PropagationHostToContainer as i32,
                ..Default::default()
            },
            pb::Mount {
                container_path: "/shared".into(),
                host_path: "/mnt/shared".into(),
                propagation: pb::MountPropagation::PropagationBidirectional as i32,
                ..Default::default()
            },
            pb::Mount {
                container_path: "/tools".into(),
                readonly: true,
                image: Some(pb::ImageSpec {
                    image: "registry.example/tools:1".into(),
                    ..Default::default()
                }),
                image_sub_path: "bin".into(),
                ..Default::default()
            },
        ]
    );
    assert_eq!((cc.stdin, cc.stdin_once, cc.tty), (true, true, true));

    // The runtime's lists now show both with the same labels and annotations.
    let listed = rt.list_sandboxes().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, sid);
    assert_eq!(
        (listed[0].labels.clone(), listed[0].annotations.clone()),
        (sb.labels.clone(), sb.annotations.clone())
    );
    assert_eq!(listed[0].state, SandboxState::Ready);
    let containers = rt.list_containers().await.unwrap();
    assert_eq!(containers[0].id, cid);
    assert_eq!(containers[0].state, ContainerState::Created);
    assert_eq!(containers[0].annotations, c.annotations);
    let status = rt.sandbox_status(&sid).await.unwrap();
    assert_eq!(status.ips.len(), 1, "{status:?}");
}

/// One pod's sandboxes and containers are asked for with the pod-UID label selector, and only
/// that pod's come back.
#[tokio::test]
async fn a_pods_lists_select_by_its_uid_label() {
    let (fake, rt) = started().await;
    let (a, b) = (pod(1), pod(2));
    let (sa, ca) = run_pod(&rt, &a).await;
    run_pod(&rt, &b).await;
    let sandboxes = rt.list_pod_sandboxes(&a.uid).await.unwrap();
    assert_eq!(
        sandboxes.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
        [sa]
    );
    let containers = rt.list_pod_containers(&a.uid).await.unwrap();
    assert_eq!(
        containers.iter().map(|c| c.id.clone()).collect::<Vec<_>>(),
        [ca]
    );
    let want: HashMap<String, String> = [(LABEL_POD_UID.to_string(), a.uid.clone())].into();
    let sf: Vec<pb::ListPodSandboxRequest> = fake.requests("ListPodSandbox");
    assert_eq!(sf[0].filter.clone().unwrap().label_selector, want);
    let cf: Vec<pb::ListContainersRequest> = fake.requests("ListContainers");
    assert_eq!(cf[0].filter.clone().unwrap().label_selector, want);
    // The node-wide lists carry no filter and see both pods.
    assert_eq!(rt.list_sandboxes().await.unwrap().len(), 2);
    let sf: Vec<pb::ListPodSandboxRequest> = fake.requests("ListPodSandbox");
    assert_eq!(sf[1].filter, None);
}

/// A stopped sandbox lists as not ready and its container as exited.
#[tokio::test]
async fn stopping_a_sandbox_shows_in_the_lists() {
    let (_fake, rt) = started().await;
    let (sid, cid) = run_pod(&rt, &pod(0)).await;
    assert_eq!(
        rt.container_status(&cid).await.unwrap().state,
        ContainerState::Running
    );
    rt.stop_sandbox(&sid).await.unwrap();
    assert_eq!(
        rt.list_sandboxes().await.unwrap()[0].state,
        SandboxState::NotReady
    );
    let st = rt.container_status(&cid).await.unwrap();
    assert_eq!((st.state, st.exit_code), (ContainerState::Exited, 137));
    rt.remove_sandbox(&sid).await.unwrap();
    assert!(rt.list_containers().await.unwrap().is_empty());
}

#[tokio::test]
async fn images_pull_with_credentials_and_a_missing_one_is_none() {
    let (fake, rt) = started().await;
    let sb = pod(0);
    assert_eq!(rt.image_status("registry.local/app:1").await.unwrap(), None);
    let auth = ImageAuth {
        username: "u".into(),
        password: "p".into(),
        location: "registry.local".into(),
    };
    let image_ref = rt
        .pull_image("registry.local/app:1", Some(&auth), &sb)
        .await
        .unwrap();
    let pulls: Vec<pb::PullImageRequest> = fake.requests("PullImage");
    let sent = pulls[0].auth.clone().unwrap();
    assert_eq!((sent.username.as_str(), sent.password.as_str()), ("u", "p"));
    assert_eq!(sent.server_address, "", "the location is not sent");
    assert_eq!(
        pulls[0]
            .sandbox_config
            .as_ref()
            .unwrap()
            .metadata
            .as_ref()
            .unwrap()
            .uid,
        sb.uid
    );
    let info = rt
        .image_status("registry.local/app:1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.id, image_ref);
    assert!(
        rt.list_images()
            .await
            .unwrap()
            .iter()
            .any(|i| i.id == image_ref)
    );
    rt.remove_image(&image_ref).await.unwrap();
    assert_eq!(rt.image_status("registry.local/app:1").await.unwrap(), None);
    // A failed pull says why.
    fake.fail(
        "PullImage",
        Code::NotFound,
        "registry.local/nope:1: not found",
    );
    let e = rt
        .pull_image("registry.local/nope:1", None, &sb)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            RuntimeError::NotFound {
                op: "PullImage",
                ..
            }
        ),
        "{e:?}"
    );
}

#[tokio::test]
async fn exec_sync_sends_the_command_and_returns_the_output() {
    let (fake, rt) = started().await;
    let (_, cid) = run_pod(&rt, &pod(0)).await;
    fake.with_state(|s| {
        s.exec_sync = pb::ExecSyncResponse {
            stdout: b"out".to_vec(),
            stderr: b"err".to_vec(),
            exit_code: 3,
        }
    });
    let cmd = vec!["sh".to_string(), "-c".into(), "exit 3".into()];
    let r = rt
        .exec_sync(&cid, &cmd, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(
        (r.exit_code, r.stdout, r.stderr),
        (3, b"out".to_vec(), b"err".to_vec())
    );
    let sent: Vec<pb::ExecSyncRequest> = fake.requests("ExecSync");
    assert_eq!(sent[0].cmd, cmd);
}

/// The stats lists go out with a filter (upstream's empty one) and report each ready
/// sandbox's figures.
#[tokio::test]
async fn stats_lists_carry_a_filter_and_report_each_ready_sandbox() {
    let (fake, rt) = started().await;
    let (s1, _) = run_pod(&rt, &pod(1)).await;
    let (s2, _) = run_pod(&rt, &pod(2)).await;
    rt.stop_sandbox(&s2).await.unwrap();
    let listed = rt.list_sandbox_stats().await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|s| (s.id.clone(), s.process_count))
            .collect::<Vec<_>>(),
        [(s1, Some(1))]
    );
    assert_eq!(rt.list_container_stats().await.unwrap().len(), 2);
    let sf: Vec<pb::ListPodSandboxStatsRequest> = fake.requests("ListPodSandboxStats");
    assert!(sf[0].filter.is_some());
    let cf: Vec<pb::ListContainerStatsRequest> = fake.requests("ListContainerStats");
    assert!(cf[0].filter.is_some());
    let fs = rt.image_fs_info().await.unwrap();
    assert_eq!(fs.image_filesystems[0].used_bytes, Some(4 << 20));
}

fn provider(rt: CriRuntime, dir: &std::path::Path) -> crate::stats::Provider {
    crate::stats::Provider::new(
        Arc::new(rt),
        Arc::new(crate::stats::node::FakeNode::default()),
        crate::stats::ProviderConfig::new("node-a".into(), dir.join("root"), dir.join("logs")),
    )
}

/// ListPodSandboxStats failing (containerd 1.6 on a stopped sandbox) costs no pod its
/// figures: the kubelet asks each ready sandbox with PodSandboxStats, over the same wire,
/// and says what the list's failure was.
#[tokio::test]
async fn when_the_stats_list_fails_each_ready_sandbox_is_asked_instead() {
    let (fake, rt) = started().await;
    let (s1, _) = run_pod(&rt, &pod(1)).await;
    let (s2, _) = run_pod(&rt, &pod(2)).await;
    let (old, _) = run_pod(&rt, &pod(3)).await;
    rt.stop_sandbox(&old).await.unwrap();
    fake.fail(
        "ListPodSandboxStats",
        Code::Unknown,
        "failed to get pod sandbox stats since sandbox container is not in ready state",
    );
    let dir = tempfile::tempdir().unwrap();
    let p = provider(rt, dir.path());
    fake.clear_calls();
    let snap = p
        .refresh()
        .await
        .expect("a refresh despite the list failing");
    let mut asked: Vec<String> = fake
        .requests::<pb::PodSandboxStatsRequest>("PodSandboxStats")
        .into_iter()
        .map(|r| r.pod_sandbox_id)
        .collect();
    asked.sort();
    let mut ready = vec![s1, s2];
    ready.sort();
    assert_eq!(asked, ready, "each ready sandbox once, the stopped one not");
    let counts: Vec<Option<u64>> = snap
        .summary
        .pods
        .iter()
        .filter(|p| p.pod_ref.uid != pod(3).uid)
        .map(|p| p.process_stats.as_ref().and_then(|s| s.process_count))
        .collect();
    assert_eq!(counts, [Some(1), Some(1)], "{:?}", snap.summary.pods);
    assert_eq!(
        snap.gaps.keys().copied().collect::<Vec<_>>(),
        [crate::stats::gaps::Source::SandboxStatsList]
    );
    assert!(
        snap.gaps[&crate::stats::gaps::Source::SandboxStatsList].contains("not in ready state")
    );

    // One sandbox's own stats failing too costs only that pod's figures, and is said.
    fake.fail_times("PodSandboxStats", 1, Code::NotFound, "sandbox gone");
    let snap = p.refresh().await.unwrap();
    let gap = &snap.gaps[&crate::stats::gaps::Source::SandboxStats];
    assert!(gap.starts_with("1 of 2 ready sandboxes"), "{gap}");
}

#[test]
fn handler_features_come_from_the_status_answer() {
    let r = pb::StatusResponse {
        runtime_handlers: vec![
            pb::RuntimeHandler {
                name: String::new(),
                features: Some(pb::RuntimeHandlerFeatures {
                    recursive_read_only_mounts: true,
                    user_namespaces: false,
                }),
            },
            pb::RuntimeHandler {
                name: "kata".into(),
                features: Some(pb::RuntimeHandlerFeatures {
                    recursive_read_only_mounts: false,
                    user_namespaces: true,
                }),
            },
        ],
        ..Default::default()
    };
    let f = |h: &str| crate::runtime::cri::handler_features(&r, h);
    assert!(f("").recursive_read_only_mounts && !f("").user_namespaces);
    assert!(!f("kata").recursive_read_only_mounts && f("kata").user_namespaces);
    // containerd 1.6 lists no handlers: nothing is supported.
    assert_eq!(
        crate::runtime::cri::handler_features(&pb::StatusResponse::default(), ""),
        crate::runtime::HandlerFeatures::default()
    );
    assert_eq!(f("runsc"), crate::runtime::HandlerFeatures::default());
}
