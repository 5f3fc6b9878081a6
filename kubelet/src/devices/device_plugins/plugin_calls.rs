//! The device manager's calls to a plugin beyond `Allocate`, each only when the plugin's
//! options ask for it: `GetPreferredAllocation` (the plugin chooses among the free devices
//! before `Allocate`) and `PreStartContainer` (before every start of a container).

use super::{AllocKey, AllocateError, DeviceManager, Endpoint, State, healthy, numa_of, server};
use std::collections::{BTreeMap, BTreeSet, HashSet};

impl DeviceManager {
    /// The devices reserved under `key`.
    pub(super) fn reserved_ids(&self, key: &AllocKey) -> Vec<String> {
        let st = self.lock();
        st.allocs
            .get(key)
            .map(|a| a.ids.values().flatten().cloned().collect())
            .unwrap_or_default()
    }

    /// Upstream's `callGetPreferredAllocationIfAvailable` for one pending reservation: when
    /// the plugin's options say `getPreferredAllocationAvailable`, it is offered every free
    /// healthy device (this reservation's included) and chooses; its choice replaces the
    /// reservation (devices it names that are not free are skipped, and the free ones in ID
    /// order fill what it left short, as upstream). A failed call fails the pod with
    /// upstream's message. Admission decided on counts only, so the choice never changes
    /// whether the pod fits. A reservation sharing devices with another container of its pod
    /// (an init container's, reused) is kept as it is.
    pub(super) async fn prefer(&self, key: &AllocKey, ep: &Endpoint) -> Result<(), AllocateError> {
        if !ep.options.get_preferred_allocation_available {
            return Ok(());
        }
        let (available, size) = {
            let st = self.lock();
            let Some(a) = st.allocs.get(key) else {
                return Ok(());
            };
            let mine: BTreeSet<&String> = a.ids.values().flatten().collect();
            let shared = st.allocs.iter().any(|(k, o)| {
                k != key
                    && k.0 == key.0
                    && k.2 == key.2
                    && o.ids.values().flatten().any(|i| mine.contains(i))
            });
            if shared || mine.is_empty() {
                return Ok(());
            }
            (free_for(&st, key), mine.len())
        };
        let preferred =
            server::preferred(ep.client.clone(), available.into_iter().collect(), size).await?;
        let mut st = self.lock();
        let free = free_for(&st, key);
        let mut chosen: Vec<String> = Vec::new();
        let mut sorted_pref: Vec<&String> =
            preferred.iter().filter(|i| free.contains(*i)).collect();
        sorted_pref.sort();
        sorted_pref.dedup();
        for id in sorted_pref.into_iter().chain(free.iter()) {
            if chosen.len() == size {
                break;
            }
            if !chosen.contains(id) {
                chosen.push(id.clone());
            }
        }
        if chosen.len() < size {
            return Ok(());
        }
        let devices = st.resources.get(&key.2).map(|r| &r.devices);
        let mut ids: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        for id in chosen {
            ids.entry(numa_of(devices.and_then(|d| d.get(&id))))
                .or_default()
                .push(id);
        }
        if let Some(a) = st.allocs.get_mut(key) {
            a.ids = ids;
        }
        Ok(())
    }

    /// Upstream's `PreStartContainer` before each start of the container: for every
    /// resource it holds whose plugin's options say `preStartRequired`, the plugin is called
    /// with the container's devices. The error is upstream's text; the container then waits
    /// in `CreateContainerConfigError` and is tried again.
    pub async fn pre_start(&self, uid: &str, container: &str) -> Result<(), String> {
        let calls = {
            let st = self.lock();
            let mut calls = Vec::new();
            for ((u, c, res), a) in &st.allocs {
                if u != uid || c != container {
                    continue;
                }
                let Some(r) = st.resources.get(res) else {
                    return Err(format!(
                        "endpoint not found in cache for a registered resource: {res}"
                    ));
                };
                // A plugin that has not registered again since a restart: its options are
                // unknown, and upstream skips the call.
                let Some(ep) = r.endpoint.as_ref() else {
                    continue;
                };
                if !ep.options.pre_start_required {
                    continue;
                }
                let ids: Vec<String> = a.ids.values().flatten().cloned().collect();
                if ids.is_empty() {
                    return Err(format!(
                        "no devices found allocated in local cache for pod {uid}, container {container}, resource {res}"
                    ));
                }
                calls.push((ep.client.clone(), ids));
            }
            calls
        };
        for (client, ids) in calls {
            server::pre_start(client, ids)
                .await
                .map_err(|e| format!("device plugin PreStartContainer rpc failed with err: {e}"))?;
        }
        Ok(())
    }
}

/// The healthy devices of `key`'s resource that no other reservation holds (those of `key`
/// itself included).
fn free_for(st: &State, key: &AllocKey) -> BTreeSet<String> {
    let in_use: HashSet<&String> = st
        .allocs
        .iter()
        .filter(|(k, _)| *k != key && k.2 == key.2)
        .flat_map(|(_, a)| a.ids.values().flatten())
        .collect();
    st.resources
        .get(&key.2)
        .map(|r| {
            r.devices
                .values()
                .filter(|d| healthy(d) && !in_use.contains(&d.id))
                .map(|d| d.id.clone())
                .collect()
        })
        .unwrap_or_default()
}
