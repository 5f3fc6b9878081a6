//! Usage of the claim-backed volumes no driver measures. A local PV is measured with
//! statfs(2) of its path, as upstream's local plugin does (MetricsStatFS): capacity, available
//! and used bytes from the block counts times the block size, inodes from the file counts.
//! It reaches `/stats/summary` (with its claim as `pvcRef`) and `kubelet_volume_stats_*`, once
//! per `volumeStatsAggPeriod`. A hostPath PV is not measured: upstream's hostPath plugin has
//! no metrics (MetricsNil), so it shows in neither.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::csi::client::VolumeStats;

/// A claim's measured usage as `kubelet_volume_stats_*` (labelled by its namespace and name).
pub(super) fn export_claim_stats(claim: Option<&(String, String)>, stats: &VolumeStats) {
    let Some((ns, claim)) = claim else {
        return;
    };
    let u = |v: i64| u64::try_from(v).unwrap_or(0);
    crate::metrics::volumes().set_volume_stats(
        ns,
        claim,
        &crate::metrics::VolumeFigures {
            capacity_bytes: u(stats.capacity_bytes),
            available_bytes: u(stats.available_bytes),
            used_bytes: u(stats.used_bytes),
            inodes: u(stats.inodes),
            inodes_free: u(stats.inodes_free),
            inodes_used: u(stats.inodes_used),
        },
    );
}

/// statfs(2) of a volume's path: the OS edge of the measurement.
pub trait FsUsage: Send + Sync {
    fn usage(&self, path: &Path) -> std::io::Result<VolumeStats>;
}

/// The real statfs(2).
#[derive(Debug, Default, Clone, Copy)]
pub struct StatFs;

impl FsUsage for StatFs {
    fn usage(&self, path: &Path) -> std::io::Result<VolumeStats> {
        let v = nix::sys::statvfs::statvfs(path).map_err(std::io::Error::from)?;
        let n = |x: u64| i64::try_from(x).unwrap_or(i64::MAX);
        let bsize = n(v.block_size());
        let (blocks, bfree, bavail) = (n(v.blocks()), n(v.blocks_free()), n(v.blocks_available()));
        let (files, ffree) = (n(v.files()), n(v.files_free()));
        Ok(VolumeStats {
            capacity_bytes: blocks.saturating_mul(bsize),
            available_bytes: bavail.saturating_mul(bsize),
            used_bytes: blocks.saturating_sub(bfree).saturating_mul(bsize),
            inodes: files,
            inodes_free: ffree,
            inodes_used: files.saturating_sub(ffree),
        })
    }
}

/// One measured local volume: `(volume name, (namespace, claim), nanoseconds since the epoch,
/// figures)`.
pub type Measurement = (String, Option<(String, String)>, i64, VolumeStats);

#[derive(Debug, Clone)]
struct Entry {
    claim: Option<(String, String)>,
    path: PathBuf,
    measured: Option<(Instant, i64, VolumeStats)>,
}

/// The local PVs set up for pods, by pod UID and volume name, with their last measurement.
pub struct LocalVolumes {
    usage: Arc<dyn FsUsage>,
    vols: Mutex<BTreeMap<String, BTreeMap<String, Entry>>>,
}

impl std::fmt::Debug for LocalVolumes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalVolumes").finish()
    }
}

impl Default for LocalVolumes {
    fn default() -> Self {
        LocalVolumes::new(Arc::new(StatFs))
    }
}

impl LocalVolumes {
    pub fn new(usage: Arc<dyn FsUsage>) -> Self {
        LocalVolumes {
            usage,
            vols: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, BTreeMap<String, Entry>>> {
        self.vols.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pod's volume `name` is the local PV at `path` (again: kept as it is).
    pub fn add(&self, pod_uid: &str, name: &str, claim: Option<(String, String)>, path: &Path) {
        let mut vols = self.lock();
        let e = vols
            .entry(pod_uid.to_string())
            .or_default()
            .entry(name.to_string())
            .or_insert_with(|| Entry {
                claim: claim.clone(),
                path: path.to_path_buf(),
                measured: None,
            });
        e.claim = claim;
        e.path = path.to_path_buf();
    }

    /// Forgets the pod's local volumes; their claims' `kubelet_volume_stats_*` go.
    pub fn remove_pod(&self, pod_uid: &str) {
        let gone = self.lock().remove(pod_uid);
        for (ns, claim) in gone
            .into_iter()
            .flat_map(|v| v.into_values())
            .filter_map(|e| e.claim)
        {
            crate::metrics::volumes().remove_volume_stats(&ns, &claim);
        }
    }

    /// Measures each volume not measured within `period` (off the async workers); a failed
    /// statfs is logged and tried at the next call.
    pub async fn measure_due(&self, period: Duration) {
        let due: Vec<(String, String, Entry)> = self
            .lock()
            .iter()
            .flat_map(|(uid, vols)| {
                vols.iter()
                    .map(move |(name, e)| (uid.clone(), name.clone(), e.clone()))
            })
            .filter(|(_, _, e)| {
                e.measured
                    .as_ref()
                    .is_none_or(|(at, _, _)| at.elapsed() >= period)
            })
            .collect();
        for (uid, name, e) in due {
            let (usage, path) = (self.usage.clone(), e.path.clone());
            let stats = match tokio::task::spawn_blocking(move || usage.usage(&path)).await {
                Ok(Ok(s)) => s,
                Ok(Err(err)) => {
                    tracing::warn!(pod_uid = %uid, volume = %name, path = %e.path.display(), error = %err, "measuring a local volume failed");
                    continue;
                }
                Err(err) => {
                    tracing::warn!(error = %err, "measuring a local volume panicked");
                    continue;
                }
            };
            export_claim_stats(e.claim.as_ref(), &stats);
            let now_ns = crate::clock::unix_now() * 1_000_000_000;
            if let Some(entry) = self.lock().get_mut(&uid).and_then(|v| v.get_mut(&name)) {
                entry.measured = Some((Instant::now(), now_ns, stats));
            }
        }
    }

    /// The last measurements of the pod's local volumes.
    pub fn pod_stats(&self, pod_uid: &str) -> Vec<Measurement> {
        self.lock()
            .get(pod_uid)
            .into_iter()
            .flatten()
            .filter_map(|(name, e)| {
                let (_, at_ns, stats) = e.measured.as_ref()?;
                Some((name.clone(), e.claim.clone(), *at_ns, *stats))
            })
            .collect()
    }
}

#[cfg(any(test, feature = "test-util"))]
pub mod fake;
#[cfg(test)]
mod tests;
