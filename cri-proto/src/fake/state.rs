//! The fake runtime's state: sandboxes, containers and images, and how the CRI's list
//! filters select from them.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

use crate::v1 as pb;

/// A sandbox the fake runs.
#[derive(Debug, Clone)]
pub struct FakeSandbox {
    pub config: pb::PodSandboxConfig,
    pub runtime_handler: String,
    pub state: pb::PodSandboxState,
    /// Nanoseconds since the epoch (the fake's clock counts calls, not time).
    pub created_at: i64,
    /// The pod IP `PodSandboxStatus` reports (`10.88.0.<n>`).
    pub ip: String,
}

/// A container the fake runs.
#[derive(Debug, Clone)]
pub struct FakeContainer {
    pub sandbox_id: String,
    pub config: pb::ContainerConfig,
    pub state: pb::ContainerState,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    /// The image's id (`ImageRef`).
    pub image_ref: String,
}

/// Everything the fake remembers; change it through [`super::FakeCri::with_state`].
#[derive(Debug, Clone)]
pub struct State {
    pub sandboxes: BTreeMap<String, FakeSandbox>,
    pub containers: BTreeMap<String, FakeContainer>,
    /// Keyed by image id (`sha256:…`).
    pub images: BTreeMap<String, pb::Image>,
    /// The `Version` answer.
    pub version: pb::VersionResponse,
    /// The `Status` answer's conditions.
    pub conditions: Vec<pb::RuntimeCondition>,
    /// The `ExecSync` answer.
    pub exec_sync: pb::ExecSyncResponse,
    /// Ids and timestamps come from this counter.
    pub next: u64,
}

impl Default for State {
    fn default() -> Self {
        State {
            sandboxes: BTreeMap::new(),
            containers: BTreeMap::new(),
            images: BTreeMap::new(),
            version: pb::VersionResponse {
                version: "0.1.0".into(),
                runtime_name: "fake-cri".into(),
                runtime_version: "1.0.0".into(),
                runtime_api_version: "v1".into(),
            },
            conditions: ["RuntimeReady", "NetworkReady"]
                .into_iter()
                .map(|t| pb::RuntimeCondition {
                    r#type: t.into(),
                    status: true,
                    ..Default::default()
                })
                .collect(),
            exec_sync: pb::ExecSyncResponse::default(),
            next: 1,
        }
    }
}

/// `sha256:` and 64 hex digits derived from `seed`.
fn digest(seed: &str) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    seed.hash(&mut h);
    let x = h.finish();
    format!("sha256:{}", format!("{x:016x}").repeat(4))
}

fn labels_match(have: &HashMap<String, String>, want: &HashMap<String, String>) -> bool {
    want.iter().all(|(k, v)| have.get(k) == Some(v))
}

impl State {
    /// A fresh id (64 hex digits, as containerd's) and timestamp.
    pub(super) fn fresh(&mut self, kind: &str) -> (String, i64) {
        let n = self.next;
        self.next += 1;
        let id = digest(&format!("{kind}-{n}"))
            .trim_start_matches("sha256:")
            .to_string();
        (id, n as i64 * 1_000_000_000)
    }

    /// Adds an image as a pull would (`size` bytes); returns its id.
    pub fn add_image(&mut self, name: &str, size: u64) -> String {
        let id = digest(name);
        let image = self.images.entry(id.clone()).or_insert_with(|| pb::Image {
            id: id.clone(),
            size,
            spec: Some(pb::ImageSpec {
                image: id.clone(),
                ..Default::default()
            }),
            ..Default::default()
        });
        if !image.repo_tags.iter().any(|t| t == name) {
            image.repo_tags.push(name.to_string());
        }
        id
    }

    /// The image a reference names: its id, or one of its tags.
    pub fn find_image(&self, reference: &str) -> Option<&pb::Image> {
        self.images.get(reference).or_else(|| {
            self.images
                .values()
                .find(|i| i.repo_tags.iter().any(|t| t == reference))
        })
    }

    pub(super) fn sandbox_pb(id: &str, s: &FakeSandbox) -> pb::PodSandbox {
        pb::PodSandbox {
            id: id.into(),
            metadata: s.config.metadata.clone(),
            state: s.state as i32,
            created_at: s.created_at,
            labels: s.config.labels.clone(),
            annotations: s.config.annotations.clone(),
            runtime_handler: s.runtime_handler.clone(),
        }
    }

    pub(super) fn container_pb(id: &str, c: &FakeContainer) -> pb::Container {
        pb::Container {
            id: id.into(),
            pod_sandbox_id: c.sandbox_id.clone(),
            metadata: c.config.metadata.clone(),
            image: c.config.image.clone(),
            image_ref: c.image_ref.clone(),
            state: c.state as i32,
            created_at: c.created_at,
            labels: c.config.labels.clone(),
            annotations: c.config.annotations.clone(),
            image_id: c.image_ref.clone(),
        }
    }

    /// The sandboxes `filter` selects (by id, state and labels; `None`: all).
    pub fn list_sandboxes(&self, filter: Option<&pb::PodSandboxFilter>) -> Vec<pb::PodSandbox> {
        self.sandboxes
            .iter()
            .filter(|(id, s)| {
                filter.is_none_or(|f| {
                    (f.id.is_empty() || f.id == **id)
                        && f.state.as_ref().is_none_or(|v| v.state == s.state as i32)
                        && labels_match(&s.config.labels, &f.label_selector)
                })
            })
            .map(|(id, s)| Self::sandbox_pb(id, s))
            .collect()
    }

    /// The containers `filter` selects (by id, state, sandbox and labels; `None`: all).
    pub fn list_containers(&self, filter: Option<&pb::ContainerFilter>) -> Vec<pb::Container> {
        self.containers
            .iter()
            .filter(|(id, c)| {
                filter.is_none_or(|f| {
                    (f.id.is_empty() || f.id == **id)
                        && (f.pod_sandbox_id.is_empty() || f.pod_sandbox_id == c.sandbox_id)
                        && f.state.as_ref().is_none_or(|v| v.state == c.state as i32)
                        && labels_match(&c.config.labels, &f.label_selector)
                })
            })
            .map(|(id, c)| Self::container_pb(id, c))
            .collect()
    }

    /// A sandbox's stats: its attributes and the number of its running containers as the
    /// process count.
    pub fn sandbox_stats(&self, id: &str) -> Option<pb::PodSandboxStats> {
        let s = self.sandboxes.get(id)?;
        let running = self
            .containers
            .values()
            .filter(|c| c.sandbox_id == id && c.state == pb::ContainerState::ContainerRunning)
            .count();
        Some(pb::PodSandboxStats {
            attributes: Some(pb::PodSandboxAttributes {
                id: id.into(),
                metadata: s.config.metadata.clone(),
                labels: s.config.labels.clone(),
                annotations: s.config.annotations.clone(),
            }),
            linux: Some(pb::LinuxPodSandboxStats {
                process: Some(pb::ProcessUsage {
                    timestamp: self.next as i64,
                    process_count: Some(pb::UInt64Value {
                        value: running as u64,
                    }),
                }),
                ..Default::default()
            }),
            windows: None,
        })
    }

    /// A container's stats: its attributes and an empty writable layer.
    pub fn container_stats(&self, id: &str) -> Option<pb::ContainerStats> {
        let c = self.containers.get(id)?;
        Some(pb::ContainerStats {
            attributes: Some(pb::ContainerAttributes {
                id: id.into(),
                metadata: c.config.metadata.clone(),
                labels: c.config.labels.clone(),
                annotations: c.config.annotations.clone(),
            }),
            writable_layer: Some(pb::FilesystemUsage {
                timestamp: self.next as i64,
                fs_id: Some(pb::FilesystemIdentifier {
                    mountpoint: "/var/lib/fake-cri/rootfs".into(),
                }),
                used_bytes: Some(pb::UInt64Value { value: 0 }),
                inodes_used: Some(pb::UInt64Value { value: 0 }),
            }),
            ..Default::default()
        })
    }
}
