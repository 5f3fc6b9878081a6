//! A [`Runtime`] that times every CRI call into `kubelet_runtime_operations_total`,
//! `kubelet_runtime_operations_errors_total` and `kubelet_runtime_operations_duration_seconds`
//! under upstream's `operation_type` names, and counts sandbox starts
//! (`kubelet_started_pods_total`, `kubelet_started_pods_errors_total`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    Container, ContainerConfig, ContainerStatus, ExecResult, ImageAuth, ImageInfo, Result, Runtime,
    Sandbox, SandboxConfig, SandboxStatus, StreamFlags, VersionInfo,
};
use super::{ContainerStats, ImageFsInfo, SandboxStats};
use crate::metrics::families;

/// Wraps another runtime; see the module doc.
pub struct Instrumented {
    inner: Arc<dyn Runtime>,
}

impl Instrumented {
    pub fn new(inner: Arc<dyn Runtime>) -> Self {
        Self { inner }
    }
}

async fn record<T>(op: &str, call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    let started = Instant::now();
    let out = call.await;
    let f = families();
    f.runtime_operations.with_label_values(&[op]).inc();
    f.runtime_operations_duration
        .with_label_values(&[op])
        .observe(started.elapsed().as_secs_f64());
    if out.is_err() {
        f.runtime_operations_errors.with_label_values(&[op]).inc();
    }
    out
}

#[async_trait::async_trait]
impl Runtime for Instrumented {
    async fn list_images(&self) -> Result<Vec<crate::runtime::ImageSummary>> {
        record("list_images", self.inner.list_images()).await
    }

    async fn remove_image(&self, image: &str) -> Result<()> {
        record("remove_image", self.inner.remove_image(image)).await
    }

    async fn version(&self) -> Result<VersionInfo> {
        record("version", self.inner.version()).await
    }

    async fn container_events(
        &self,
    ) -> Result<tokio::sync::mpsc::Receiver<crate::runtime::RuntimeEvent>> {
        record("get_container_events", self.inner.container_events()).await
    }

    async fn cgroup_driver(&self) -> Result<crate::runtime::RuntimeCgroupDriver> {
        record("runtime_config", self.inner.cgroup_driver()).await
    }

    async fn status(&self) -> Result<Vec<crate::runtime::RuntimeCondition>> {
        record("status", self.inner.status()).await
    }

    async fn runtime_features(&self) -> Result<crate::runtime::RuntimeFeatures> {
        record("status", self.inner.runtime_features()).await
    }

    async fn handler_features(&self, handler: &str) -> Result<crate::runtime::HandlerFeatures> {
        record("status", self.inner.handler_features(handler)).await
    }

    async fn list_sandboxes(&self) -> Result<Vec<Sandbox>> {
        record("list_podsandbox", self.inner.list_sandboxes()).await
    }

    async fn list_pod_sandboxes(&self, uid: &str) -> Result<Vec<Sandbox>> {
        record("list_podsandbox", self.inner.list_pod_sandboxes(uid)).await
    }

    async fn sandbox_status(&self, id: &str) -> Result<SandboxStatus> {
        record("podsandbox_status", self.inner.sandbox_status(id)).await
    }

    async fn run_sandbox(&self, config: &SandboxConfig) -> Result<String> {
        families().started_pods.inc();
        let out = record("run_podsandbox", self.inner.run_sandbox(config)).await;
        if out.is_err() {
            families().started_pods_errors.inc();
        }
        out
    }

    async fn stop_sandbox(&self, id: &str) -> Result<()> {
        record("stop_podsandbox", self.inner.stop_sandbox(id)).await
    }

    async fn remove_sandbox(&self, id: &str) -> Result<()> {
        record("remove_podsandbox", self.inner.remove_sandbox(id)).await
    }

    async fn list_containers(&self) -> Result<Vec<Container>> {
        record("list_containers", self.inner.list_containers()).await
    }

    async fn list_pod_containers(&self, uid: &str) -> Result<Vec<Container>> {
        record("list_containers", self.inner.list_pod_containers(uid)).await
    }

    async fn container_status(&self, id: &str) -> Result<ContainerStatus> {
        record("container_status", self.inner.container_status(id)).await
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        sandbox: &SandboxConfig,
    ) -> Result<String> {
        record(
            "create_container",
            self.inner.create_container(sandbox_id, config, sandbox),
        )
        .await
    }

    async fn start_container(&self, id: &str) -> Result<()> {
        record("start_container", self.inner.start_container(id)).await
    }

    async fn stop_container(&self, id: &str, timeout: Duration) -> Result<()> {
        record("stop_container", self.inner.stop_container(id, timeout)).await
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        record("remove_container", self.inner.remove_container(id)).await
    }

    async fn exec_sync(&self, id: &str, cmd: &[String], timeout: Duration) -> Result<ExecResult> {
        record("exec_sync", self.inner.exec_sync(id, cmd, timeout)).await
    }

    async fn exec(&self, id: &str, cmd: &[String], flags: StreamFlags) -> Result<String> {
        record("exec", self.inner.exec(id, cmd, flags)).await
    }

    async fn attach(&self, id: &str, flags: StreamFlags) -> Result<String> {
        record("attach", self.inner.attach(id, flags)).await
    }

    async fn port_forward(&self, sandbox_id: &str, ports: &[i32]) -> Result<String> {
        record("port_forward", self.inner.port_forward(sandbox_id, ports)).await
    }

    async fn image_status(&self, image: &str) -> Result<Option<ImageInfo>> {
        record("image_status", self.inner.image_status(image)).await
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<&ImageAuth>,
        sandbox: &SandboxConfig,
    ) -> Result<String> {
        record("pull_image", self.inner.pull_image(image, auth, sandbox)).await
    }

    async fn list_container_stats(&self) -> Result<Vec<ContainerStats>> {
        record("list_container_stats", self.inner.list_container_stats()).await
    }

    async fn list_sandbox_stats(&self) -> Result<Vec<SandboxStats>> {
        record("list_podsandbox_stats", self.inner.list_sandbox_stats()).await
    }

    async fn sandbox_stats(&self, id: &str) -> Result<SandboxStats> {
        record("podsandbox_stats", self.inner.sandbox_stats(id)).await
    }

    async fn image_fs_info(&self) -> Result<ImageFsInfo> {
        record("image_fs_info", self.inner.image_fs_info()).await
    }

    async fn reopen_container_log(&self, id: &str) -> Result<()> {
        record("reopen_container_log", self.inner.reopen_container_log(id)).await
    }

    async fn update_container_resources(
        &self,
        id: &str,
        resources: &crate::runtime::LinuxResources,
    ) -> Result<()> {
        record(
            "update_container",
            self.inner.update_container_resources(id, resources),
        )
        .await
    }

    async fn update_sandbox_resources(
        &self,
        sandbox_id: &str,
        overhead: &crate::runtime::LinuxResources,
        resources: &crate::runtime::LinuxResources,
    ) -> Result<()> {
        record(
            "update_podsandbox_resources",
            self.inner
                .update_sandbox_resources(sandbox_id, overhead, resources),
        )
        .await
    }
}
