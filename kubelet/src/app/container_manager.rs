//! Starts the container manager: the node's cgroup tree (`kubepods` and its QoS tiers) over
//! the cgroup filesystem or systemd.

use super::AppError;
use crate::cm::driver;
use crate::cm::{CgroupNamer, CgroupVersion, Cgroups, CmConfig, ContainerManager, FsCgroups};
use crate::cm::{PodLimits, SwapBehavior};
use crate::config::Config;
use std::sync::Arc;

/// Settings that upstream refuses on a cgroup v1 node: LimitedSwap, and singleProcessOOMKill
/// explicitly false (v1 always kills single processes).
fn needs_cgroup_v2(version: CgroupVersion, limits: &PodLimits) -> Result<(), AppError> {
    if version != CgroupVersion::V1 {
        return Ok(());
    }
    if limits.swap_behavior == SwapBehavior::LimitedSwap {
        return Err(AppError::LimitedSwapOnCgroupV1);
    }
    if limits.single_process_oom_kill == Some(false) {
        return Err(AppError::SingleProcessOomKillOnCgroupV1);
    }
    Ok(())
}

/// The container manager over the node's cgroup filesystem: `kubepods` and its QoS tiers
/// with their limits (node allocatable when enforced). A controller the node lacks is one
/// warning and its limits are skipped; a cgroup that cannot be created or limited stops the
/// start, as upstream's "Failed to start ContainerManager"; LimitedSwap on cgroup v1 is
/// refused.
/// The cgroup driver is the runtime's answer to RuntimeConfig, else `cgroupDriver` (see
/// [`crate::cm::driver`]).
pub(super) async fn start(
    cfg: &Config,
    runtime: &dyn crate::runtime::Runtime,
) -> Result<Arc<ContainerManager>, AppError> {
    let driver = driver::from_runtime(runtime, cfg.cgroup_driver, driver::RETRY_DELAY)
        .await
        .map_err(AppError::RuntimeConfig)?;
    let fs = FsCgroups::discover();
    let version = fs.version();
    needs_cgroup_v2(version, &cfg.pod_limits)?;
    let missing = fs.missing(&crate::cm::LIMITED_CONTROLLERS);
    if !missing.is_empty() {
        tracing::warn!(
            ?version,
            "cgroup controllers {missing:?} are not available on this node: their limits are not written"
        );
    }
    let fs: Arc<dyn Cgroups> = Arc::new(fs);
    let inner: Arc<dyn Cgroups> = match driver {
        crate::cm::CgroupDriver::Cgroupfs => fs,
        crate::cm::CgroupDriver::Systemd => {
            use crate::cm::{DbusUnits, NoSystemd, SystemdUnits};
            let units: Arc<dyn SystemdUnits> = if std::path::Path::new("/run/systemd/system")
                .exists()
            {
                match DbusUnits::connect().await {
                    Ok(u) => Arc::new(u),
                    Err(e) => {
                        tracing::error!(error = %e, "cgroupDriver systemd: cannot reach systemd over D-Bus");
                        Arc::new(NoSystemd)
                    }
                }
            } else {
                // Every call fails with SystemdError::NotRunning: the node setup below
                // reports it and the start stops, as upstream's.
                Arc::new(NoSystemd)
            };
            Arc::new(crate::cm::SystemdCgroups::new(units, fs))
        }
    };
    let cgroups: Arc<dyn Cgroups> = Arc::new(crate::cm::InstrumentedCgroups::new(inner));
    let hugepages = crate::host::hugepages();
    let cm = Arc::new(ContainerManager::new(
        cgroups,
        CmConfig {
            namer: CgroupNamer {
                driver,
                root: cfg.cgroup_root.clone(),
                per_qos: cfg.cgroups_per_qos,
            },
            pod_limits: cfg.pod_limits.clone(),
            resources: cfg.resources.clone(),
            hugepage_sizes: hugepages.keys().copied().collect(),
        },
    ));
    let capacity = crate::cm::NodeCapacity {
        cpu_millis: std::thread::available_parallelism()
            .map(|n| n.get() as i64 * 1000)
            .unwrap_or(1000),
        memory_bytes: crate::host::memory_capacity(),
        pids: crate::host::pid_capacity(),
        hugepages,
    };
    let setup = cm.clone();
    match tokio::task::spawn_blocking(move || setup.setup_node(&capacity)).await {
        Ok(Ok(())) => Ok(cm),
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(AppError::ContainerManagerPanicked(e.to_string())),
    }
}

/// The device manager on `<root-dir>/device-plugins`: allocations restored from its
/// checkpoint (a corrupt one is reported and left out, as upstream), then the registration
/// socket served until `cancel`.
pub(super) async fn start_devices(
    cfg: &Config,
    tasks: &mut tokio::task::JoinSet<()>,
    cancel: &tokio_util::sync::CancellationToken,
) -> Arc<crate::devices::DeviceManager> {
    use crate::devices::{DEVICE_PLUGINS_DIR, DeviceManager};
    let dm = Arc::new(DeviceManager::new(cfg.root_dir.join(DEVICE_PLUGINS_DIR)));
    // Restored allocations stay until the static pod source has said which pods are its.
    dm.await_static_source();
    let d = dm.clone();
    match tokio::task::spawn_blocking(move || d.restore()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "device manager checkpoint not restored"),
        Err(e) => tracing::warn!(error = %e, "device manager checkpoint not restored"),
    }
    let (d, c) = (dm.clone(), cancel.clone());
    tasks.spawn(async move {
        if let Err(e) = d.serve(c).await {
            tracing::error!(error = %e, "device plugin registration is not served");
        }
    });
    dm
}

/// Sends the pods whose devices changed health to the sync loop for a re-sync (upstream's
/// sync loop reading the container manager's `Updates()`), until `cancel`.
pub(super) async fn forward_health_updates(
    mut updates: crate::devices::HealthUpdates,
    sync_loop: tokio::sync::mpsc::Sender<crate::sync_loop::Control>,
    cancel: tokio_util::sync::CancellationToken,
) {
    loop {
        let uids = tokio::select! {
            _ = cancel.cancelled() => return,
            u = updates.recv() => match u {
                Some(u) => u,
                None => return,
            },
        };
        if sync_loop
            .send(crate::sync_loop::Control::Resync(uids))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// The DRA manager: claims read from the apiserver (cluster mode), what was prepared before
/// restored from `<root-dir>/dra_manager_state` (a corrupt file is reported and left out).
/// In cluster mode the node's ResourceSlices are wiped now and per driver when its plugin
/// has been gone for upstream's grace period (`devices::SLICE_WIPING_DELAY`), until `cancel`.
pub(super) async fn start_dra(
    cfg: &Config,
    cluster: Option<&super::cluster::Connected>,
    cancel: &tokio_util::sync::CancellationToken,
) -> Arc<crate::devices::DraManager> {
    use crate::devices::{
        ClaimApi, DraManager, KubeClaimApi, KubeSliceApi, SLICE_WIPING_DELAY, SliceCleanup,
    };
    let api = cluster.map(|c| {
        Arc::new(KubeClaimApi {
            client: c.client.clone(),
        }) as Arc<dyn ClaimApi>
    });
    let m = Arc::new(DraManager::new(&cfg.root_dir, api));
    let d = m.clone();
    match tokio::task::spawn_blocking(move || d.restore()).await {
        Ok(Ok(n)) => tracing::debug!(claims = n, "DRA state restored"),
        Ok(Err(e)) => tracing::error!(error = %e, "DRA state not restored"),
        Err(e) => tracing::error!(error = %e, "DRA state not restored"),
    }
    if let Some(c) = cluster {
        let api = Arc::new(KubeSliceApi {
            client: c.client.clone(),
        });
        m.start_slice_cleanup(SliceCleanup::new(
            api,
            &cfg.node_name,
            SLICE_WIPING_DELAY,
            cancel.child_token(),
        ));
    }
    m
}

/// How often claims of pods that are gone are unprepared (upstream's DRA reconcile period).
const DRA_RECONCILE_PERIOD: std::time::Duration = std::time::Duration::from_secs(60);

/// Upstream's DRA reconcile loop: once every source has reported, claims still prepared for
/// a pod the agent no longer knows (deleted while the agent was down) are unprepared.
pub(super) async fn reconcile_dra(
    dra: Arc<crate::devices::DraManager>,
    pods: super::eviction::SyncLoopPods,
    cancel: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(DRA_RECONCILE_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        if pods
            .0
            .send(crate::sync_loop::Control::KnownPods(tx))
            .await
            .is_err()
        {
            return;
        }
        let Ok(Some(known)) = rx.await else {
            continue;
        };
        dra.reconcile(&known.into_iter().collect()).await;
    }
}

/// The sync loop's workers as the pod resources API's active pods (`Control::ActivePods`).
struct SyncLoopActive(tokio::sync::mpsc::Sender<crate::sync_loop::Control>);

#[async_trait::async_trait]
impl crate::podresources::ActivePods for SyncLoopActive {
    async fn active_pods(&self) -> Vec<k8s_openapi::api::core::v1::Pod> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let msg = crate::sync_loop::Control::ActivePods(tx);
        if self.0.send(msg).await.is_err() {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }
}

/// The pod resources API on `<root-dir>/pod-resources/kubelet.sock` until `cancel`: the
/// sync loop's active pods with the devices the device manager gave them.
pub(super) fn start_pod_resources(
    cfg: &Config,
    control: tokio::sync::mpsc::Sender<crate::sync_loop::Control>,
    devices: Option<Arc<crate::devices::DeviceManager>>,
    dra: Arc<crate::devices::DraManager>,
    tasks: &mut tokio::task::JoinSet<()>,
    cancel: &tokio_util::sync::CancellationToken,
) {
    use crate::podresources::{PodResources, serve};
    let service =
        Arc::new(PodResources::new(Arc::new(SyncLoopActive(control)), devices).with_dra(dra));
    let (root, cancel) = (cfg.root_dir.clone(), cancel.clone());
    tasks.spawn(async move {
        if let Err(e) = serve(root, service, cancel).await {
            tracing::error!(error = %e, "the pod resources API is not served");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_v1_refuses_limited_swap_and_an_explicit_false_single_process_oom_kill() {
        let limits = |swap, single| PodLimits {
            swap_behavior: swap,
            single_process_oom_kill: single,
            ..PodLimits::default()
        };
        let v1 = CgroupVersion::V1;
        assert!(needs_cgroup_v2(v1, &limits(SwapBehavior::NoSwap, None)).is_ok());
        assert!(needs_cgroup_v2(v1, &limits(SwapBehavior::NoSwap, Some(true))).is_ok());
        let e = needs_cgroup_v2(v1, &limits(SwapBehavior::NoSwap, Some(false))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid configuration: singleProcessOOMKill must not be explicitly set to false when using cgroup v1"
        );
        assert!(needs_cgroup_v2(v1, &limits(SwapBehavior::LimitedSwap, None)).is_err());
        let v2 = CgroupVersion::V2;
        assert!(needs_cgroup_v2(v2, &limits(SwapBehavior::LimitedSwap, Some(false))).is_ok());
    }
}
