use super::*;

mod wire;

#[test]
fn security_settings_reach_the_cri_messages() {
    let sandbox = SandboxConfig {
        name: "p".into(),
        namespace: "default".into(),
        uid: "u".into(),
        attempt: 0,
        hostname: "p".into(),
        log_directory: String::new(),
        dns: None,
        port_mappings: vec![],
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        cgroup_parent: String::new(),
        host_network: false,
        host_pid: true,
        share_process_namespace: false,
        host_ipc: false,
        sysctls: BTreeMap::new(),
        security: SandboxSecurity {
            privileged: true,
            run_as_user: Some(7),
            supplemental_groups: vec![3000],
            seccomp: Some(SecurityProfile::RuntimeDefault),
            ..Default::default()
        },
        resources: None,
        overhead: None,
        runtime_handler: String::new(),
        userns: None,
    };
    let sb = sandbox_pb(&sandbox)
        .linux
        .unwrap()
        .security_context
        .unwrap();
    assert!(sb.privileged);
    assert_eq!(sb.run_as_user.map(|u| u.value), Some(7));
    assert_eq!(sb.supplemental_groups, vec![3000]);
    assert_eq!(
        sb.seccomp.map(|s| s.profile_type),
        Some(pb::security_profile::ProfileType::RuntimeDefault as i32)
    );
    let mut c = crate::runtime::raw::container(&sandbox);
    c.security = ContainerSecurity {
        run_as_user: Some(1000),
        supplemental_groups: vec![3000, 4000],
        supplemental_groups_policy: SupplementalGroupsPolicy::Strict,
        capabilities_drop: vec!["ALL".into()],
        no_new_privs: true,
        readonly_rootfs: true,
        masked_paths: vec!["/proc/kcore".into()],
        seccomp: Some(SecurityProfile::Localhost(
            "/var/lib/kubelet/seccomp/p.json".into(),
        )),
        apparmor: Some(SecurityProfile::Unconfined),
        apparmor_profile: "unconfined".into(),
        ..Default::default()
    };
    let s = container_security_pb(&c, &sandbox);
    assert_eq!(s.run_as_user.map(|u| u.value), Some(1000));
    assert_eq!(s.supplemental_groups, vec![3000, 4000]);
    assert_eq!(
        s.supplemental_groups_policy,
        pb::SupplementalGroupsPolicy::Strict as i32
    );
    assert_eq!(s.capabilities.unwrap().drop_capabilities, vec!["ALL"]);
    assert!(s.no_new_privs && s.readonly_rootfs && !s.privileged);
    assert_eq!(s.masked_paths, vec!["/proc/kcore"]);
    let seccomp = s.seccomp.unwrap();
    assert_eq!(seccomp.localhost_ref, "/var/lib/kubelet/seccomp/p.json");
    assert_eq!(
        seccomp.profile_type,
        pb::security_profile::ProfileType::Localhost as i32
    );
    assert_eq!(
        s.namespace_options.unwrap().pid,
        pb::NamespaceMode::Node as i32
    );
    // No capabilities message at all when the spec names none.
    c.security.capabilities_drop.clear();
    assert!(container_security_pb(&c, &sandbox).capabilities.is_none());
}

/// The sandbox's resources and overhead reach `LinuxPodSandboxConfig` on the wire.
#[test]
fn sandbox_resources_and_overhead_reach_the_cri_message() {
    let mut sandbox = crate::runtime::raw::sandbox(0, "t", std::path::Path::new("/tmp"), "");
    sandbox.resources = Some(LinuxResources {
        cpu_shares: 512,
        cpu_quota: 50_000,
        cpu_period: 100_000,
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    });
    sandbox.overhead = Some(LinuxResources {
        cpu_shares: 256,
        memory_limit_in_bytes: 120 << 20,
        ..Default::default()
    });
    let linux = sandbox_pb(&sandbox).linux.unwrap();
    let r = linux.resources.unwrap();
    assert_eq!(
        (
            r.cpu_shares,
            r.cpu_quota,
            r.cpu_period,
            r.memory_limit_in_bytes
        ),
        (512, 50_000, 100_000, 64 << 20)
    );
    let o = linux.overhead.unwrap();
    assert_eq!((o.cpu_shares, o.memory_limit_in_bytes), (256, 120 << 20));
}

/// containerd 1.6's ListPodSandboxStats: without a filter it asks every sandbox in its store
/// and the first one not ready fails the whole answer; with a filter, even an empty one, it
/// skips sandboxes that are not ready. PodSandboxStats answers for one sandbox.
struct Containerd16 {
    /// Whether each ListContainerStats carried a filter.
    container_filters: std::sync::Mutex<Vec<bool>>,
}

fn stats_of(id: &str) -> pb::PodSandboxStats {
    pb::PodSandboxStats {
        attributes: Some(pb::PodSandboxAttributes {
            id: id.into(),
            ..Default::default()
        }),
        linux: Some(pb::LinuxPodSandboxStats {
            process: Some(pb::ProcessUsage {
                timestamp: 1,
                process_count: Some(pb::UInt64Value { value: 3 }),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl cri_proto::RuntimeService for Containerd16 {
    async fn list_pod_sandbox_stats(
        &self,
        req: tonic::Request<pb::ListPodSandboxStatsRequest>,
    ) -> Result<tonic::Response<pb::ListPodSandboxStatsResponse>, tonic::Status> {
        if req.into_inner().filter.is_none() {
            return Err(tonic::Status::unknown(
                "failed to decode sandbox container metrics for sandbox \"old\": failed to get pod sandbox stats since sandbox container \"old\" is not in ready state",
            ));
        }
        Ok(tonic::Response::new(pb::ListPodSandboxStatsResponse {
            stats: vec![stats_of("new")],
        }))
    }

    async fn pod_sandbox_stats(
        &self,
        req: tonic::Request<pb::PodSandboxStatsRequest>,
    ) -> Result<tonic::Response<pb::PodSandboxStatsResponse>, tonic::Status> {
        let id = req.into_inner().pod_sandbox_id;
        Ok(tonic::Response::new(pb::PodSandboxStatsResponse {
            stats: Some(stats_of(&id)),
        }))
    }

    async fn list_container_stats(
        &self,
        req: tonic::Request<pb::ListContainerStatsRequest>,
    ) -> Result<tonic::Response<pb::ListContainerStatsResponse>, tonic::Status> {
        let filtered = req.into_inner().filter.is_some();
        self.container_filters.lock().unwrap().push(filtered);
        Ok(tonic::Response::new(
            pb::ListContainerStatsResponse::default(),
        ))
    }
}

/// The stats lists carry an (empty) filter, as upstream's: on containerd 1.6 a pod's old,
/// stopped sandbox then no longer fails ListPodSandboxStats for the whole node.
#[tokio::test]
async fn stats_lists_carry_a_filter_so_a_stopped_sandbox_fails_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cri.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let fake = std::sync::Arc::new(Containerd16 {
        container_filters: Default::default(),
    });
    let server = tokio::spawn({
        let svc = cri_proto::RuntimeServiceServer::from_arc(fake.clone());
        async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
                .await
        }
    });
    let endpoint = format!("unix://{}", path.display());
    let ch = cri_proto::connect(&endpoint, Duration::from_secs(5))
        .await
        .unwrap();
    let rt = CriRuntime::new(ch.clone(), ch, Duration::from_secs(5));
    let listed = rt
        .list_sandbox_stats()
        .await
        .expect("the stopped sandbox is skipped");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, "new");
    assert_eq!(listed[0].process_count, Some(3));
    let one = rt.sandbox_stats("new").await.unwrap();
    assert_eq!((one.id.as_str(), one.process_count), ("new", Some(3)));
    rt.list_container_stats().await.unwrap();
    assert_eq!(*fake.container_filters.lock().unwrap(), [true]);
    server.abort();
}

/// `shareProcessNamespace` gives the sandbox and every container the pod's PID namespace; an
/// ephemeral container's target joins the target's PID namespace only where each container
/// has its own (upstream), and hostPID wins over both.
#[test]
fn pid_namespace_follows_share_process_namespace_and_ephemeral_targets() {
    let mut sandbox = crate::runtime::raw::sandbox(0, "pid", std::path::Path::new("/tmp/logs"), "");
    let mut c = crate::runtime::raw::container(&sandbox);
    let pid = |c: &ContainerConfig, sb: &SandboxConfig| {
        let ns = container_security_pb(c, sb).namespace_options.unwrap();
        (ns.pid, ns.target_id)
    };
    let container = pb::NamespaceMode::Container as i32;
    assert_eq!(pid(&c, &sandbox), (container, String::new()));
    sandbox.share_process_namespace = true;
    let pod = pb::NamespaceMode::Pod as i32;
    assert_eq!(
        sandbox_pb(&sandbox)
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .unwrap()
            .pid,
        pod
    );
    assert_eq!(pid(&c, &sandbox), (pod, String::new()));
    // An ephemeral container in a pod that shares one PID namespace needs no target.
    c.security.pid_target = Some("target-id".into());
    assert_eq!(pid(&c, &sandbox), (pod, String::new()));
    sandbox.share_process_namespace = false;
    assert_eq!(
        pid(&c, &sandbox),
        (pb::NamespaceMode::Target as i32, "target-id".into())
    );
    sandbox.host_pid = true;
    assert_eq!(
        pid(&c, &sandbox),
        (pb::NamespaceMode::Node as i32, String::new())
    );
}

/// A runtime with `RuntimeConfig` (containerd 2.x, CRI-O): answers `linux` with this raw
/// cgroup driver value (`None`: no `linux` part).
struct WithRuntimeConfig(Option<i32>);

#[tonic::async_trait]
impl cri_proto::RuntimeService for WithRuntimeConfig {
    async fn runtime_config(
        &self,
        _req: tonic::Request<pb::RuntimeConfigRequest>,
    ) -> Result<tonic::Response<pb::RuntimeConfigResponse>, tonic::Status> {
        Ok(tonic::Response::new(pb::RuntimeConfigResponse {
            linux: self
                .0
                .map(|d| pb::LinuxRuntimeConfiguration { cgroup_driver: d }),
        }))
    }
}

/// Serves `svc` on a fresh unix socket; the client and the server's task.
async fn serve<S: cri_proto::RuntimeService>(
    dir: &std::path::Path,
    svc: S,
) -> (CriRuntime, tokio::task::JoinHandle<()>) {
    let path = dir.join("cri.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(cri_proto::RuntimeServiceServer::new(svc))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await;
    });
    let ch = cri_proto::connect(
        &format!("unix://{}", path.display()),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    (
        CriRuntime::new(ch.clone(), ch, Duration::from_secs(5)),
        server,
    )
}

/// RuntimeConfig's cgroup driver through the wire: containerd 1.6's Unimplemented is its
/// own answer (the kubelet falls back), the enum maps as CRI numbers it (SYSTEMD = 0,
/// CGROUPFS = 1), a value outside it is an error naming it.
#[tokio::test]
async fn runtime_config_cgroup_driver_through_the_wire() {
    use crate::runtime::RuntimeCgroupDriver as D;
    let old = Containerd16 {
        container_filters: Default::default(),
    };
    let cases: Vec<(Option<i32>, Result<D, &str>)> = vec![
        (Some(0), Ok(D::Systemd)),
        (Some(1), Ok(D::Cgroupfs)),
        (None, Ok(D::NotReported)),
        (Some(7), Err("unknown cgroup driver 7")),
    ];
    let dir = tempfile::tempdir().unwrap();
    let (rt, server) = serve(dir.path(), old).await;
    assert_eq!(rt.cgroup_driver().await.unwrap(), D::Unimplemented);
    server.abort();
    for (i, (answer, want)) in cases.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let (rt, server) = serve(dir.path(), WithRuntimeConfig(answer)).await;
        let got = rt.cgroup_driver().await;
        match want {
            Ok(d) => assert_eq!(got.unwrap(), d, "case {i}"),
            Err(text) => {
                let e = got.unwrap_err().to_string();
                assert!(e.contains(text), "case {i}: {e}");
            }
        }
        server.abort();
    }
}

/// A runtime with GetContainerEvents (containerd 2.x, CRI-O): one event, then the stream ends.
struct WithEvents;

#[tonic::async_trait]
impl cri_proto::RuntimeService for WithEvents {
    async fn get_container_events(
        &self,
        _req: tonic::Request<pb::GetEventsRequest>,
    ) -> Result<tonic::Response<tonic::codegen::BoxStream<pb::ContainerEventResponse>>, tonic::Status>
    {
        let ev = pb::ContainerEventResponse {
            container_id: "c1".into(),
            container_event_type: pb::ContainerEventType::ContainerStoppedEvent as i32,
            created_at: 5,
            pod_sandbox_status: Some(pb::PodSandboxStatus {
                metadata: Some(pb::PodSandboxMetadata {
                    uid: "u1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            containers_statuses: Vec::new(),
        };
        Ok(tonic::Response::new(Box::pin(tokio_stream::iter([Ok(ev)]))))
    }
}

/// GetContainerEvents through the wire: events arrive in the runtime's terms and the
/// receiver ends with the stream; containerd 1.6 (Unimplemented) ends it at once.
#[tokio::test]
async fn container_events_through_the_wire() {
    use crate::runtime::{RuntimeEvent, RuntimeEventKind};
    async fn within(rx: &mut tokio::sync::mpsc::Receiver<RuntimeEvent>) -> Option<RuntimeEvent> {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("the receiver answers")
    }
    let dir = tempfile::tempdir().unwrap();
    let (rt, server) = serve(dir.path(), WithEvents).await;
    let mut rx = rt.container_events().await.unwrap();
    assert_eq!(
        within(&mut rx).await,
        Some(RuntimeEvent {
            container_id: "c1".into(),
            kind: RuntimeEventKind::Stopped,
            pod_uid: "u1".into(),
            created_at: 5,
        })
    );
    assert_eq!(within(&mut rx).await, None, "the stream ended");
    server.abort();
    let dir = tempfile::tempdir().unwrap();
    let old = Containerd16 {
        container_filters: Default::default(),
    };
    let (rt, server) = serve(dir.path(), old).await;
    let mut rx = rt.container_events().await.unwrap();
    assert_eq!(within(&mut rx).await, None, "no stream on containerd 1.6");
    server.abort();
}

/// A pod with its own user namespace: mode POD with its mappings in the sandbox's and the
/// container's namespace options, and its bind mounts idmapped with them (an image volume is
/// left to the runtime); a pod without one: mode NODE and plain mounts.
#[test]
fn user_namespace_reaches_sandbox_container_and_mounts() {
    let mut sandbox = crate::runtime::raw::sandbox(0, "u", std::path::Path::new("/l"), "/k");
    let m = IdMapping {
        host_id: 131072,
        container_id: 0,
        length: 65536,
    };
    let mut c = crate::runtime::raw::container(&sandbox);
    c.mounts = vec![
        Mount {
            container_path: "/data".into(),
            host_path: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/d".into(),
            ..Default::default()
        },
        Mount {
            container_path: "/img".into(),
            image: Some("img:1".into()),
            ..Default::default()
        },
    ];
    let plain = container_pb(&c, &sandbox);
    let ns = |o: Option<&pb::NamespaceOption>| o.unwrap().userns_options.clone().unwrap();
    let sb_ns = |s: &SandboxConfig| {
        ns(sandbox_pb(s)
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .as_ref())
    };
    assert_eq!(sb_ns(&sandbox).mode, pb::NamespaceMode::Node as i32);
    assert!(plain.mounts[0].uid_mappings.is_empty());

    sandbox.userns = Some(UserNamespace {
        uids: vec![m],
        gids: vec![m],
    });
    let want = vec![pb::IdMapping {
        host_id: 131072,
        container_id: 0,
        length: 65536,
    }];
    let s = sb_ns(&sandbox);
    assert_eq!(s.mode, pb::NamespaceMode::Pod as i32);
    assert_eq!(
        (s.uids.clone(), s.gids.clone()),
        (want.clone(), want.clone())
    );
    let cc = container_pb(&c, &sandbox);
    let cs = ns(cc
        .linux
        .as_ref()
        .unwrap()
        .security_context
        .as_ref()
        .unwrap()
        .namespace_options
        .as_ref());
    assert_eq!(cs, s, "the container joins the pod's user namespace");
    assert_eq!(cc.mounts[0].uid_mappings, want);
    assert_eq!(cc.mounts[0].gid_mappings, want);
    assert!(
        cc.mounts[1].uid_mappings.is_empty(),
        "image volumes are the runtime's"
    );
}

/// Status's handlers (in the runtime's order) and its `features` become the node's runtime
/// features; a runtime without `features` (containerd 1.6) says nothing of the groups policy.
#[test]
fn runtime_features_list_every_handler_and_the_groups_policy() {
    let handler = |name: &str, userns: bool| pb::RuntimeHandler {
        name: name.into(),
        features: Some(pb::RuntimeHandlerFeatures {
            recursive_read_only_mounts: true,
            user_namespaces: userns,
        }),
    };
    let mut r = pb::StatusResponse {
        runtime_handlers: vec![handler("", true), handler("kata", false)],
        features: Some(pb::RuntimeFeatures {
            supplemental_groups_policy: true,
            ..Default::default()
        }),
        ..Default::default()
    };
    let f = runtime_features(&r);
    let names: Vec<&str> = f.handlers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["", "kata"]);
    assert!(f.handlers[0].1.user_namespaces && !f.handlers[1].1.user_namespaces);
    assert_eq!(f.supplemental_groups_policy, Some(true));
    r.features = None;
    assert_eq!(runtime_features(&r).supplemental_groups_policy, None);
}
