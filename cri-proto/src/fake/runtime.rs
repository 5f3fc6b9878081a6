//! The fake's `RuntimeService`: sandboxes, containers, exec and stats.

use tonic::{Request, Response, Status};

use super::Svc;
use super::state::{FakeContainer, FakeSandbox, State};
use crate::v1 as pb;

type Answer<T> = Result<Response<T>, Status>;

fn ok<T>(msg: T) -> Answer<T> {
    Ok(Response::new(msg))
}

fn not_found(kind: &str, id: &str) -> Status {
    Status::not_found(format!(
        "an error occurred when try to find {kind} {id:?}: not found"
    ))
}

fn stream_url(kind: &str, id: &str) -> String {
    format!("http://127.0.0.1:10010/{kind}/{id}")
}

#[tonic::async_trait]
impl crate::RuntimeService for Svc {
    async fn version(&self, req: Request<pb::VersionRequest>) -> Answer<pb::VersionResponse> {
        self.enter("Version", req).await?;
        ok(self.state().version.clone())
    }

    async fn status(&self, req: Request<pb::StatusRequest>) -> Answer<pb::StatusResponse> {
        self.enter("Status", req).await?;
        ok(pb::StatusResponse {
            status: Some(pb::RuntimeStatus {
                conditions: self.state().conditions.clone(),
            }),
            ..Default::default()
        })
    }

    async fn run_pod_sandbox(
        &self,
        req: Request<pb::RunPodSandboxRequest>,
    ) -> Answer<pb::RunPodSandboxResponse> {
        let r = self.enter("RunPodSandbox", req).await?;
        let config = r
            .config
            .ok_or_else(|| Status::invalid_argument("sandbox config is required"))?;
        let mut st = self.state();
        let (id, now) = st.fresh("sandbox");
        let ip = format!("10.88.0.{}", st.sandboxes.len() % 250 + 2);
        st.sandboxes.insert(
            id.clone(),
            FakeSandbox {
                config,
                runtime_handler: r.runtime_handler,
                state: pb::PodSandboxState::SandboxReady,
                created_at: now,
                ip,
            },
        );
        ok(pb::RunPodSandboxResponse { pod_sandbox_id: id })
    }

    async fn stop_pod_sandbox(
        &self,
        req: Request<pb::StopPodSandboxRequest>,
    ) -> Answer<pb::StopPodSandboxResponse> {
        let r = self.enter("StopPodSandbox", req).await?;
        let mut st = self.state();
        let (_, now) = st.fresh("stop");
        let id = r.pod_sandbox_id;
        if let Some(s) = st.sandboxes.get_mut(&id) {
            s.state = pb::PodSandboxState::SandboxNotready;
        }
        for c in st.containers.values_mut().filter(|c| c.sandbox_id == id) {
            if c.state == pb::ContainerState::ContainerRunning {
                c.state = pb::ContainerState::ContainerExited;
                c.finished_at = now;
                c.exit_code = 137;
            }
        }
        ok(pb::StopPodSandboxResponse {})
    }

    async fn remove_pod_sandbox(
        &self,
        req: Request<pb::RemovePodSandboxRequest>,
    ) -> Answer<pb::RemovePodSandboxResponse> {
        let r = self.enter("RemovePodSandbox", req).await?;
        let mut st = self.state();
        let id = r.pod_sandbox_id;
        st.sandboxes.remove(&id);
        st.containers.retain(|_, c| c.sandbox_id != id);
        ok(pb::RemovePodSandboxResponse {})
    }

    async fn pod_sandbox_status(
        &self,
        req: Request<pb::PodSandboxStatusRequest>,
    ) -> Answer<pb::PodSandboxStatusResponse> {
        let r = self.enter("PodSandboxStatus", req).await?;
        let st = self.state();
        let s = st
            .sandboxes
            .get(&r.pod_sandbox_id)
            .ok_or_else(|| not_found("sandbox", &r.pod_sandbox_id))?;
        ok(pb::PodSandboxStatusResponse {
            status: Some(pb::PodSandboxStatus {
                id: r.pod_sandbox_id.clone(),
                metadata: s.config.metadata.clone(),
                state: s.state as i32,
                created_at: s.created_at,
                network: Some(pb::PodSandboxNetworkStatus {
                    ip: s.ip.clone(),
                    additional_ips: vec![],
                }),
                labels: s.config.labels.clone(),
                annotations: s.config.annotations.clone(),
                runtime_handler: s.runtime_handler.clone(),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    async fn list_pod_sandbox(
        &self,
        req: Request<pb::ListPodSandboxRequest>,
    ) -> Answer<pb::ListPodSandboxResponse> {
        let r = self.enter("ListPodSandbox", req).await?;
        ok(pb::ListPodSandboxResponse {
            items: self.state().list_sandboxes(r.filter.as_ref()),
        })
    }

    async fn create_container(
        &self,
        req: Request<pb::CreateContainerRequest>,
    ) -> Answer<pb::CreateContainerResponse> {
        let r = self.enter("CreateContainer", req).await?;
        let config = r
            .config
            .ok_or_else(|| Status::invalid_argument("container config is required"))?;
        let mut st = self.state();
        if !st.sandboxes.contains_key(&r.pod_sandbox_id) {
            return Err(not_found("sandbox", &r.pod_sandbox_id));
        }
        let image = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        let image_ref = st
            .find_image(&image)
            .map(|i| i.id.clone())
            .ok_or_else(|| Status::not_found(format!("image {image:?}: not found")))?;
        let (id, now) = st.fresh("container");
        st.containers.insert(
            id.clone(),
            FakeContainer {
                sandbox_id: r.pod_sandbox_id,
                config,
                state: pb::ContainerState::ContainerCreated,
                created_at: now,
                started_at: 0,
                finished_at: 0,
                exit_code: 0,
                image_ref,
            },
        );
        ok(pb::CreateContainerResponse { container_id: id })
    }

    async fn start_container(
        &self,
        req: Request<pb::StartContainerRequest>,
    ) -> Answer<pb::StartContainerResponse> {
        let r = self.enter("StartContainer", req).await?;
        let mut st = self.state();
        let (_, now) = st.fresh("start");
        let c = st
            .containers
            .get_mut(&r.container_id)
            .ok_or_else(|| not_found("container", &r.container_id))?;
        if c.state != pb::ContainerState::ContainerCreated {
            return Err(Status::failed_precondition(format!(
                "container {:?} is not in created state",
                r.container_id
            )));
        }
        c.state = pb::ContainerState::ContainerRunning;
        c.started_at = now;
        ok(pb::StartContainerResponse {})
    }

    async fn stop_container(
        &self,
        req: Request<pb::StopContainerRequest>,
    ) -> Answer<pb::StopContainerResponse> {
        let r = self.enter("StopContainer", req).await?;
        let mut st = self.state();
        let (_, now) = st.fresh("stop");
        let c = st
            .containers
            .get_mut(&r.container_id)
            .ok_or_else(|| not_found("container", &r.container_id))?;
        if c.state == pb::ContainerState::ContainerRunning {
            c.state = pb::ContainerState::ContainerExited;
            c.finished_at = now;
            c.exit_code = 143;
        }
        ok(pb::StopContainerResponse {})
    }

    async fn remove_container(
        &self,
        req: Request<pb::RemoveContainerRequest>,
    ) -> Answer<pb::RemoveContainerResponse> {
        let r = self.enter("RemoveContainer", req).await?;
        self.state().containers.remove(&r.container_id);
        ok(pb::RemoveContainerResponse {})
    }

    async fn list_containers(
        &self,
        req: Request<pb::ListContainersRequest>,
    ) -> Answer<pb::ListContainersResponse> {
        let r = self.enter("ListContainers", req).await?;
        ok(pb::ListContainersResponse {
            containers: self.state().list_containers(r.filter.as_ref()),
        })
    }

    async fn container_status(
        &self,
        req: Request<pb::ContainerStatusRequest>,
    ) -> Answer<pb::ContainerStatusResponse> {
        let r = self.enter("ContainerStatus", req).await?;
        let st = self.state();
        let c = st
            .containers
            .get(&r.container_id)
            .ok_or_else(|| not_found("container", &r.container_id))?;
        ok(pb::ContainerStatusResponse {
            status: Some(pb::ContainerStatus {
                id: r.container_id.clone(),
                metadata: c.config.metadata.clone(),
                state: c.state as i32,
                created_at: c.created_at,
                started_at: c.started_at,
                finished_at: c.finished_at,
                exit_code: c.exit_code,
                image: c.config.image.clone(),
                image_ref: c.image_ref.clone(),
                image_id: c.image_ref.clone(),
                labels: c.config.labels.clone(),
                annotations: c.config.annotations.clone(),
                mounts: c.config.mounts.clone(),
                log_path: c.config.log_path.clone(),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    async fn reopen_container_log(
        &self,
        req: Request<pb::ReopenContainerLogRequest>,
    ) -> Answer<pb::ReopenContainerLogResponse> {
        let r = self.enter("ReopenContainerLog", req).await?;
        if !self.state().containers.contains_key(&r.container_id) {
            return Err(not_found("container", &r.container_id));
        }
        ok(pb::ReopenContainerLogResponse {})
    }

    async fn exec_sync(&self, req: Request<pb::ExecSyncRequest>) -> Answer<pb::ExecSyncResponse> {
        let r = self.enter("ExecSync", req).await?;
        let st = self.state();
        if !st.containers.contains_key(&r.container_id) {
            return Err(not_found("container", &r.container_id));
        }
        ok(st.exec_sync.clone())
    }

    async fn exec(&self, req: Request<pb::ExecRequest>) -> Answer<pb::ExecResponse> {
        let r = self.enter("Exec", req).await?;
        ok(pb::ExecResponse {
            url: stream_url("exec", &r.container_id),
        })
    }

    async fn attach(&self, req: Request<pb::AttachRequest>) -> Answer<pb::AttachResponse> {
        let r = self.enter("Attach", req).await?;
        ok(pb::AttachResponse {
            url: stream_url("attach", &r.container_id),
        })
    }

    async fn port_forward(
        &self,
        req: Request<pb::PortForwardRequest>,
    ) -> Answer<pb::PortForwardResponse> {
        let r = self.enter("PortForward", req).await?;
        ok(pb::PortForwardResponse {
            url: stream_url("portforward", &r.pod_sandbox_id),
        })
    }

    async fn list_container_stats(
        &self,
        req: Request<pb::ListContainerStatsRequest>,
    ) -> Answer<pb::ListContainerStatsResponse> {
        let r = self.enter("ListContainerStats", req).await?;
        let st = self.state();
        let f = r.filter.unwrap_or_default();
        let filter = pb::ContainerFilter {
            id: f.id,
            pod_sandbox_id: f.pod_sandbox_id,
            label_selector: f.label_selector,
            state: None,
        };
        let stats = st
            .list_containers(Some(&filter))
            .iter()
            .filter_map(|c| st.container_stats(&c.id))
            .collect();
        ok(pb::ListContainerStatsResponse { stats })
    }

    async fn list_pod_sandbox_stats(
        &self,
        req: Request<pb::ListPodSandboxStatsRequest>,
    ) -> Answer<pb::ListPodSandboxStatsResponse> {
        let r = self.enter("ListPodSandboxStats", req).await?;
        let st = self.state();
        let f = r.filter.unwrap_or_default();
        ok(pb::ListPodSandboxStatsResponse {
            stats: ready_sandbox_stats(&st, &f),
        })
    }

    async fn pod_sandbox_stats(
        &self,
        req: Request<pb::PodSandboxStatsRequest>,
    ) -> Answer<pb::PodSandboxStatsResponse> {
        let r = self.enter("PodSandboxStats", req).await?;
        let stats = self
            .state()
            .sandbox_stats(&r.pod_sandbox_id)
            .ok_or_else(|| not_found("sandbox", &r.pod_sandbox_id))?;
        ok(pb::PodSandboxStatsResponse { stats: Some(stats) })
    }
}

/// The stats of the ready sandboxes `f` selects.
fn ready_sandbox_stats(st: &State, f: &pb::PodSandboxStatsFilter) -> Vec<pb::PodSandboxStats> {
    let filter = pb::PodSandboxFilter {
        id: f.id.clone(),
        label_selector: f.label_selector.clone(),
        state: Some(pb::PodSandboxStateValue {
            state: pb::PodSandboxState::SandboxReady as i32,
        }),
    };
    st.list_sandboxes(Some(&filter))
        .iter()
        .filter_map(|s| st.sandbox_stats(&s.id))
        .collect()
}
