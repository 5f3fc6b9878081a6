//! [`Runtime`] over the CRI v1 gRPC API (containerd, CRI-O) on a unix socket.

use super::cri_config::cgroup_driver_of;
use super::cri_stats::{container_stats_pb, fs_pb, sandbox_stats_pb};
use super::*;
use cri_proto::v1 as pb;
use cri_proto::{Channel, ImageServiceClient, RuntimeServiceClient};

mod convert;
use convert::*;
pub use convert::{container_security_pb, sandbox_pb};

/// A CRI runtime reached through one gRPC channel (tonic reconnects it after a runtime restart).
#[derive(Clone)]
pub struct CriRuntime {
    runtime: RuntimeServiceClient<Channel>,
    image: ImageServiceClient<Channel>,
    timeout: Duration,
}

impl std::fmt::Debug for CriRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriRuntime")
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl CriRuntime {
    async fn sandboxes(&self, filter: Option<pb::PodSandboxFilter>) -> Result<Vec<Sandbox>> {
        let r = self
            .runtime
            .clone()
            .list_pod_sandbox(self.req(pb::ListPodSandboxRequest { filter }))
            .await
            .map_err(|s| err("ListPodSandbox", s))?
            .into_inner();
        Ok(r.items
            .into_iter()
            .map(|s| {
                let md = s.metadata.unwrap_or_default();
                Sandbox {
                    id: s.id,
                    pod_name: md.name,
                    pod_namespace: md.namespace,
                    pod_uid: md.uid,
                    attempt: md.attempt,
                    state: sandbox_state(s.state),
                    created_at: s.created_at,
                    labels: btree(s.labels),
                    annotations: btree(s.annotations),
                }
            })
            .collect())
    }

    async fn containers(&self, filter: Option<pb::ContainerFilter>) -> Result<Vec<Container>> {
        let r = self
            .runtime
            .clone()
            .list_containers(self.req(pb::ListContainersRequest { filter }))
            .await
            .map_err(|s| err("ListContainers", s))?
            .into_inner();
        Ok(r.containers
            .into_iter()
            .map(|c| {
                let md = c.metadata.unwrap_or_default();
                Container {
                    id: c.id,
                    sandbox_id: c.pod_sandbox_id,
                    name: md.name,
                    attempt: md.attempt,
                    image: c.image.map(|i| i.image).unwrap_or_default(),
                    image_ref: c.image_ref,
                    state: container_state(c.state),
                    created_at: c.created_at,
                    labels: btree(c.labels),
                    annotations: btree(c.annotations),
                }
            })
            .collect())
    }

    /// Wraps channels to the runtime and image services; every call gets `timeout`.
    pub fn new(runtime: Channel, image: Channel, timeout: Duration) -> Self {
        Self {
            runtime: cri_proto::runtime_client(runtime),
            image: cri_proto::image_client(image),
            timeout,
        }
    }

    fn req<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.set_timeout(self.timeout);
        r
    }

    /// The runtime's Status answer (conditions and handlers' features), not verbose.
    async fn status_pb(&self) -> Result<pb::StatusResponse> {
        let req = self.req(pb::StatusRequest { verbose: false });
        let r = self.runtime.clone().status(req).await;
        Ok(r.map_err(|s| err("Status", s))?.into_inner())
    }
}

#[async_trait::async_trait]
impl Runtime for CriRuntime {
    async fn status(&self) -> Result<Vec<crate::runtime::RuntimeCondition>> {
        let r = self.status_pb().await?;
        Ok(r.status
            .map(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .map(|c| crate::runtime::RuntimeCondition {
                type_: c.r#type,
                status: c.status,
                reason: c.reason,
                message: c.message,
            })
            .collect())
    }

    async fn cgroup_driver(&self) -> Result<RuntimeCgroupDriver> {
        let req = self.req(pb::RuntimeConfigRequest {});
        match self.runtime.clone().runtime_config(req).await {
            Ok(r) => cgroup_driver_of(r.into_inner().linux),
            // containerd 1.6: the kubelet falls back to its configured driver.
            Err(s) if s.code() == tonic::Code::Unimplemented => {
                Ok(RuntimeCgroupDriver::Unimplemented)
            }
            Err(s) => Err(err("RuntimeConfig", s)),
        }
    }

    async fn runtime_features(&self) -> Result<crate::runtime::RuntimeFeatures> {
        Ok(runtime_features(&self.status_pb().await?))
    }

    async fn handler_features(&self, handler: &str) -> Result<crate::runtime::HandlerFeatures> {
        Ok(handler_features(&self.status_pb().await?, handler))
    }

    async fn version(&self) -> Result<VersionInfo> {
        let r = self
            .runtime
            .clone()
            .version(self.req(pb::VersionRequest {
                version: cri_proto::CRI_API_VERSION.into(),
            }))
            .await
            .map_err(|s| err("Version", s))?
            .into_inner();
        Ok(VersionInfo {
            runtime_name: r.runtime_name,
            runtime_version: r.runtime_version,
            runtime_api_version: r.runtime_api_version,
        })
    }

    async fn list_sandboxes(&self) -> Result<Vec<Sandbox>> {
        self.sandboxes(None).await
    }

    async fn list_pod_sandboxes(&self, uid: &str) -> Result<Vec<Sandbox>> {
        let listed = self
            .sandboxes(Some(pb::PodSandboxFilter {
                label_selector: pod_uid_selector(uid),
                ..Default::default()
            }))
            .await?;
        // The runtime filters; checking again costs nothing and does not trust it to.
        Ok(listed.into_iter().filter(|s| s.pod_uid == uid).collect())
    }

    async fn list_containers(&self) -> Result<Vec<Container>> {
        self.containers(None).await
    }

    async fn list_pod_containers(&self, uid: &str) -> Result<Vec<Container>> {
        let listed = self
            .containers(Some(pb::ContainerFilter {
                label_selector: pod_uid_selector(uid),
                ..Default::default()
            }))
            .await?;
        Ok(listed
            .into_iter()
            .filter(|c| c.labels.get(LABEL_POD_UID).map(String::as_str) == Some(uid))
            .collect())
    }

    async fn sandbox_status(&self, id: &str) -> Result<SandboxStatus> {
        let r = self
            .runtime
            .clone()
            .pod_sandbox_status(self.req(pb::PodSandboxStatusRequest {
                pod_sandbox_id: id.into(),
                verbose: false,
            }))
            .await
            .map_err(|s| err("PodSandboxStatus", s))?
            .into_inner();
        let s = r.status.unwrap_or_default();
        let mut ips = Vec::new();
        if let Some(n) = s.network {
            if !n.ip.is_empty() {
                ips.push(n.ip);
            }
            ips.extend(
                n.additional_ips
                    .into_iter()
                    .map(|p| p.ip)
                    .filter(|ip| !ip.is_empty()),
            );
        }
        Ok(SandboxStatus {
            id: s.id,
            state: sandbox_state(s.state),
            ips,
            created_at: s.created_at,
        })
    }

    async fn run_sandbox(&self, config: &SandboxConfig) -> Result<String> {
        let r = self
            .runtime
            .clone()
            .run_pod_sandbox(self.req(pb::RunPodSandboxRequest {
                config: Some(sandbox_pb(config)),
                runtime_handler: config.runtime_handler.clone(),
            }))
            .await
            .map_err(|s| err("RunPodSandbox", s))?;
        Ok(r.into_inner().pod_sandbox_id)
    }

    async fn stop_sandbox(&self, id: &str) -> Result<()> {
        self.runtime
            .clone()
            .stop_pod_sandbox(self.req(pb::StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            }))
            .await
            .map_err(|s| err("StopPodSandbox", s))?;
        Ok(())
    }

    async fn remove_sandbox(&self, id: &str) -> Result<()> {
        self.runtime
            .clone()
            .remove_pod_sandbox(self.req(pb::RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            }))
            .await
            .map_err(|s| err("RemovePodSandbox", s))?;
        Ok(())
    }

    async fn container_status(&self, id: &str) -> Result<ContainerStatus> {
        let r = self
            .runtime
            .clone()
            .container_status(self.req(pb::ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            }))
            .await
            .map_err(|s| err("ContainerStatus", s))?
            .into_inner();
        let s = r.status.ok_or_else(|| RuntimeError::NotFound {
            op: "ContainerStatus",
            message: id.into(),
        })?;
        let md = s.metadata.unwrap_or_default();
        Ok(ContainerStatus {
            id: s.id,
            name: md.name,
            attempt: md.attempt,
            state: container_state(s.state),
            created_at: s.created_at,
            started_at: s.started_at,
            finished_at: s.finished_at,
            exit_code: s.exit_code,
            image: s.image.map(|i| i.image).unwrap_or_default(),
            image_ref: s.image_ref,
            reason: s.reason,
            message: s.message,
            labels: btree(s.labels),
            annotations: btree(s.annotations),
            log_path: s.log_path,
        })
    }

    async fn reopen_container_log(&self, id: &str) -> Result<()> {
        self.runtime
            .clone()
            .reopen_container_log(self.req(pb::ReopenContainerLogRequest {
                container_id: id.into(),
            }))
            .await
            .map_err(|s| err("ReopenContainerLog", s))?;
        Ok(())
    }

    async fn update_container_resources(&self, id: &str, r: &LinuxResources) -> Result<()> {
        self.runtime
            .clone()
            .update_container_resources(self.req(pb::UpdateContainerResourcesRequest {
                container_id: id.into(),
                linux: Some(resources(r)),
                ..Default::default()
            }))
            .await
            .map_err(|s| err("UpdateContainerResources", s))?;
        Ok(())
    }

    async fn container_events(&self) -> Result<tokio::sync::mpsc::Receiver<RuntimeEvent>> {
        // The stream lives as long as the runtime does: no deadline on it. It is opened in
        // the forwarding task (a runtime may send the response headers only with its first
        // event); a runtime without the call (containerd 1.6: Unimplemented) or one that
        // breaks the stream ends the receiver, which the evented PLEG counts as a failure.
        let mut client = self.runtime.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        tokio::spawn(async move {
            let open = client.get_container_events(tonic::Request::new(pb::GetEventsRequest {}));
            let mut stream = tokio::select! {
                _ = tx.closed() => return,
                r = open => match r {
                    Ok(r) => r.into_inner(),
                    Err(s) => {
                        tracing::debug!(error = %err("GetContainerEvents", s), "no container event stream");
                        return;
                    }
                },
            };
            loop {
                let msg = tokio::select! {
                    _ = tx.closed() => return,
                    m = stream.message() => m,
                };
                match msg {
                    Ok(Some(e)) => {
                        if tx.send(event_of(e)).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => return,
                    Err(s) => {
                        tracing::debug!(error = %err("GetContainerEvents", s), "the container event stream broke");
                        return;
                    }
                }
            }
        });
        Ok(rx)
    }

    async fn update_sandbox_resources(
        &self,
        sandbox_id: &str,
        overhead: &LinuxResources,
        r: &LinuxResources,
    ) -> Result<()> {
        let answer = self
            .runtime
            .clone()
            .update_pod_sandbox_resources(self.req(pb::UpdatePodSandboxResourcesRequest {
                pod_sandbox_id: sandbox_id.into(),
                overhead: Some(resources(overhead)),
                resources: Some(resources(r)),
            }))
            .await;
        match answer {
            Ok(_) => Ok(()),
            // Optional for runtimes (containerd 1.6 has no such call): upstream logs and
            // goes on.
            Err(s) if s.code() == tonic::Code::Unimplemented => {
                tracing::debug!(
                    sandbox = sandbox_id,
                    "the runtime has no UpdatePodSandboxResources"
                );
                Ok(())
            }
            Err(s) => Err(err("UpdatePodSandboxResources", s)),
        }
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        sandbox: &SandboxConfig,
    ) -> Result<String> {
        let r = self
            .runtime
            .clone()
            .create_container(self.req(pb::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.into(),
                config: Some(container_pb(config, sandbox)),
                sandbox_config: Some(sandbox_pb(sandbox)),
            }))
            .await
            .map_err(|s| err("CreateContainer", s))?;
        Ok(r.into_inner().container_id)
    }

    async fn start_container(&self, id: &str) -> Result<()> {
        self.runtime
            .clone()
            .start_container(self.req(pb::StartContainerRequest {
                container_id: id.into(),
            }))
            .await
            .map_err(|s| err("StartContainer", s))?;
        Ok(())
    }

    async fn stop_container(&self, id: &str, timeout: Duration) -> Result<()> {
        let mut req = tonic::Request::new(pb::StopContainerRequest {
            container_id: id.into(),
            timeout: timeout.as_secs() as i64,
        });
        // The call lasts as long as the grace period, plus the usual allowance.
        req.set_timeout(timeout + self.timeout);
        self.runtime
            .clone()
            .stop_container(req)
            .await
            .map_err(|s| err("StopContainer", s))?;
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        self.runtime
            .clone()
            .remove_container(self.req(pb::RemoveContainerRequest {
                container_id: id.into(),
            }))
            .await
            .map_err(|s| err("RemoveContainer", s))?;
        Ok(())
    }

    async fn exec_sync(&self, id: &str, cmd: &[String], timeout: Duration) -> Result<ExecResult> {
        let mut req = tonic::Request::new(pb::ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.to_vec(),
            timeout: timeout.as_secs() as i64,
        });
        req.set_timeout(timeout + self.timeout);
        let r = self
            .runtime
            .clone()
            .exec_sync(req)
            .await
            .map_err(|s| err("ExecSync", s))?
            .into_inner();
        Ok(ExecResult {
            exit_code: r.exit_code,
            stdout: r.stdout,
            stderr: r.stderr,
        })
    }

    async fn exec(&self, id: &str, cmd: &[String], flags: StreamFlags) -> Result<String> {
        let r = self
            .runtime
            .clone()
            .exec(self.req(pb::ExecRequest {
                container_id: id.into(),
                cmd: cmd.to_vec(),
                tty: flags.tty,
                stdin: flags.stdin,
                stdout: flags.stdout,
                stderr: flags.stderr,
            }))
            .await
            .map_err(|s| err("Exec", s))?;
        Ok(r.into_inner().url)
    }

    async fn attach(&self, id: &str, flags: StreamFlags) -> Result<String> {
        let r = self
            .runtime
            .clone()
            .attach(self.req(pb::AttachRequest {
                container_id: id.into(),
                stdin: flags.stdin,
                tty: flags.tty,
                stdout: flags.stdout,
                stderr: flags.stderr,
            }))
            .await
            .map_err(|s| err("Attach", s))?;
        Ok(r.into_inner().url)
    }

    async fn port_forward(&self, sandbox_id: &str, ports: &[i32]) -> Result<String> {
        let r = self
            .runtime
            .clone()
            .port_forward(self.req(pb::PortForwardRequest {
                pod_sandbox_id: sandbox_id.into(),
                port: ports.to_vec(),
            }))
            .await
            .map_err(|s| err("PortForward", s))?;
        Ok(r.into_inner().url)
    }

    async fn list_images(&self) -> Result<Vec<crate::runtime::ImageSummary>> {
        let r = self
            .image
            .clone()
            .list_images(self.req(pb::ListImagesRequest { filter: None }))
            .await
            .map_err(|s| err("ListImages", s))?
            .into_inner();
        Ok(r.images
            .into_iter()
            .map(|i| crate::runtime::ImageSummary {
                id: i.id,
                repo_tags: i.repo_tags,
                repo_digests: i.repo_digests,
                size: i.size,
                pinned: i.pinned,
            })
            .collect())
    }

    async fn remove_image(&self, image: &str) -> Result<()> {
        self.image
            .clone()
            .remove_image(self.req(pb::RemoveImageRequest {
                image: Some(pb::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
            }))
            .await
            .map_err(|s| err("RemoveImage", s))?;
        Ok(())
    }

    async fn image_status(&self, image: &str) -> Result<Option<ImageInfo>> {
        let r = self
            .image
            .clone()
            .image_status(self.req(pb::ImageStatusRequest {
                image: Some(pb::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                verbose: false,
            }))
            .await
            .map_err(|s| err("ImageStatus", s))?
            .into_inner();
        Ok(r.image.map(|i| ImageInfo {
            id: i.id,
            size: i.size,
            user: ImageUser {
                uid: i.uid.map(|u| u.value),
                username: i.username,
            },
        }))
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<&ImageAuth>,
        sandbox: &SandboxConfig,
    ) -> Result<String> {
        // No deadline, as upstream's PullImage (the caller's context only): a large image on a
        // slow registry may take any time. The pull ends when the runtime answers (containerd
        // gives up on a pull that stops making progress: `image_pull_progress_timeout`) or
        // when the caller drops this future (the pod is deleted: the stream is reset and the
        // runtime cancels the pull).
        let req = tonic::Request::new(pb::PullImageRequest {
            image: Some(pb::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            auth: auth.map(|a| pb::AuthConfig {
                username: a.username.clone(),
                password: a.password.clone(),
                // Upstream's keyring leaves the server address empty (containerd would
                // parse it as a URL); the image names the registry.
                ..Default::default()
            }),
            sandbox_config: Some(sandbox_pb(sandbox)),
        });
        let r = self
            .image
            .clone()
            .pull_image(req)
            .await
            .map_err(|s| err("PullImage", s))?
            .into_inner();
        Ok(r.image_ref)
    }

    async fn list_container_stats(&self) -> Result<Vec<ContainerStats>> {
        let r = self
            .runtime
            .clone()
            .list_container_stats(self.req(pb::ListContainerStatsRequest {
                filter: Some(pb::ContainerStatsFilter::default()),
            }))
            .await
            .map_err(|s| err("ListContainerStats", s))?
            .into_inner();
        Ok(r.stats.into_iter().map(container_stats_pb).collect())
    }

    async fn list_sandbox_stats(&self) -> Result<Vec<SandboxStats>> {
        let r = self
            .runtime
            .clone()
            .list_pod_sandbox_stats(self.req(pb::ListPodSandboxStatsRequest {
                // Present though empty, as upstream's `&PodSandboxStatsFilter{}`: containerd
                // 1.6 skips sandboxes that are not ready only when a filter is given.
                filter: Some(pb::PodSandboxStatsFilter::default()),
            }))
            .await
            .map_err(|s| err("ListPodSandboxStats", s))?
            .into_inner();
        Ok(r.stats.into_iter().map(sandbox_stats_pb).collect())
    }

    async fn sandbox_stats(&self, id: &str) -> Result<SandboxStats> {
        let r = self
            .runtime
            .clone()
            .pod_sandbox_stats(self.req(pb::PodSandboxStatsRequest {
                pod_sandbox_id: id.into(),
            }))
            .await
            .map_err(|s| err("PodSandboxStats", s))?
            .into_inner();
        r.stats
            .map(sandbox_stats_pb)
            .ok_or_else(|| RuntimeError::Call {
                op: "PodSandboxStats",
                message: format!("no stats for sandbox {id}"),
            })
    }

    async fn image_fs_info(&self) -> Result<ImageFsInfo> {
        let r = self
            .image
            .clone()
            .image_fs_info(self.req(pb::ImageFsInfoRequest {}))
            .await
            .map_err(|s| err("ImageFsInfo", s))?
            .into_inner();
        Ok(ImageFsInfo {
            image_filesystems: r.image_filesystems.into_iter().map(fs_pb).collect(),
            container_filesystems: r.container_filesystems.into_iter().map(fs_pb).collect(),
        })
    }
}

#[cfg(test)]
mod tests;

/// A CRI container event in the runtime's terms.
fn event_of(e: pb::ContainerEventResponse) -> RuntimeEvent {
    let kind = match pb::ContainerEventType::try_from(e.container_event_type) {
        Ok(pb::ContainerEventType::ContainerCreatedEvent) => RuntimeEventKind::Created,
        Ok(pb::ContainerEventType::ContainerStartedEvent) => RuntimeEventKind::Started,
        Ok(pb::ContainerEventType::ContainerStoppedEvent) => RuntimeEventKind::Stopped,
        // An unknown kind still says the container changed; deleted is the widest.
        _ => RuntimeEventKind::Deleted,
    };
    RuntimeEvent {
        container_id: e.container_id,
        kind,
        pod_uid: e
            .pod_sandbox_status
            .and_then(|s| s.metadata)
            .map(|m| m.uid)
            .unwrap_or_default(),
        created_at: e.created_at,
    }
}
