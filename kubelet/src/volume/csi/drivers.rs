//! The CSI drivers registered on this node and the plugin manager's handler for
//! `CSIPlugin` sockets (node-driver-registrar): versions are validated as upstream does (the
//! highest version of major 1 wins; a driver already registered with a higher or equal
//! version keeps its place), `NodeGetInfo` is asked, and the node's record in the cluster is
//! updated ([`super::nodeinfo`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::CsiError;
use super::client::CsiNode;
use super::log;
use super::nodeinfo::NodeInfoApi;
use crate::pluginmanager::{PluginError, PluginHandler};

/// A version as upstream's ParseGeneric reads it: dot-separated numbers (at least two, the
/// first without a leading zero), an optional leading `v`, anything after the numbers
/// ignored.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(Vec<u64>);

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u64::to_string).collect();
        f.write_str(&parts.join("."))
    }
}

/// Why a version string does not parse (upstream's ParseGeneric messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    #[error("could not parse {0:?} as version")]
    Unparsable(String),
    #[error("illegal zero-prefixed version component {component:?} in {version:?}")]
    ZeroPrefixed { component: String, version: String },
    #[error("illegal version string {version:?}: {message}")]
    Illegal { version: String, message: String },
}

impl Version {
    pub fn parse_generic(s: &str) -> Result<Version, VersionError> {
        let t = s.trim();
        let t = t.strip_prefix('v').unwrap_or(t);
        let numeric_end = t
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(t.len());
        let mut head = &t[..numeric_end];
        // A trailing '.' belongs to the uninterpreted rest.
        while head.ends_with('.') {
            head = &head[..head.len() - 1];
        }
        let parts: Vec<&str> = head.split('.').collect();
        if parts.len() < 2 || parts.iter().any(|p| p.is_empty()) {
            return Err(VersionError::Unparsable(s.to_string()));
        }
        if parts[0].len() > 1 && parts[0].starts_with('0') {
            return Err(VersionError::ZeroPrefixed {
                component: parts[0].to_string(),
                version: s.to_string(),
            });
        }
        let nums = parts
            .iter()
            .map(|p| {
                p.parse::<u64>().map_err(|e| VersionError::Illegal {
                    version: s.to_string(),
                    message: e.to_string(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Version(nums))
    }

    fn major(&self) -> u64 {
        self.0[0]
    }
}

/// The highest version of major at most 1 in `versions`; it must be a 1.x (upstream's
/// highestSupportedVersion).
pub fn highest_supported_version(versions: &[String]) -> Result<Version, CsiError> {
    if versions.is_empty() {
        return Err(CsiError::NoVersions);
    }
    let mut best: Option<Version> = None;
    let mut last_err = None;
    for v in versions.iter().rev() {
        match Version::parse_generic(v) {
            Err(e) => last_err = Some(e),
            Ok(v) if v.major() > 1 => {}
            Ok(v) => {
                if best.as_ref().is_none_or(|b| *b < v) {
                    best = Some(v);
                }
            }
        }
    }
    let Some(best) = best else {
        return Err(CsiError::NoSupportedVersion {
            versions: versions.to_vec(),
            last: last_err,
        });
    };
    if best.major() != 1 {
        return Err(CsiError::NotV1(best));
    }
    Ok(best)
}

/// One registered driver.
#[derive(Clone)]
pub struct Driver {
    pub endpoint: String,
    pub highest_version: Version,
    pub node: Arc<dyn CsiNode>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("endpoint", &self.endpoint)
            .field("highest_version", &self.highest_version)
            .finish()
    }
}

/// The drivers registered now, by name.
#[derive(Debug, Default)]
pub struct CsiDrivers {
    drivers: Mutex<BTreeMap<String, Driver>>,
    changed: tokio::sync::Notify,
}

impl CsiDrivers {
    pub fn get(&self, name: &str) -> Option<Driver> {
        self.lock().get(name).cloned()
    }

    pub fn names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    fn set(&self, name: &str, d: Driver) {
        self.lock().insert(name.to_string(), d);
        self.changed.notify_waiters();
    }

    fn remove(&self, name: &str) -> Option<Driver> {
        let d = self.lock().remove(name);
        self.changed.notify_waiters();
        d
    }

    /// Waits for the next registration or removal (volume setups waiting for a driver).
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Driver>> {
        self.drivers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Makes the Node-service client of a driver's endpoint.
pub type Connector = Arc<dyn Fn(&str) -> Arc<dyn CsiNode> + Send + Sync>;

/// The plugin manager's handler of `CSIPlugin` sockets (upstream's csi RegistrationHandler).
pub struct RegistrationHandler {
    drivers: Arc<CsiDrivers>,
    connect: Connector,
    /// The cluster record; None for a standalone kubelet.
    node_info: Option<Arc<dyn NodeInfoApi>>,
}

impl std::fmt::Debug for RegistrationHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistrationHandler")
            .field("drivers", &self.drivers)
            .finish()
    }
}

impl RegistrationHandler {
    pub fn new(
        drivers: Arc<CsiDrivers>,
        connect: Connector,
        node_info: Option<Arc<dyn NodeInfoApi>>,
    ) -> Self {
        RegistrationHandler {
            drivers,
            connect,
            node_info,
        }
    }

    fn validate_versions(
        &self,
        caller: &'static str,
        name: &str,
        versions: &[String],
    ) -> Result<Version, CsiError> {
        if versions.is_empty() {
            return Err(CsiError::EmptyVersions {
                caller,
                driver: name.to_string(),
            });
        }
        let new =
            highest_supported_version(versions).map_err(|e| CsiError::UnsupportedVersions {
                caller,
                driver: name.to_string(),
                versions: versions.to_vec(),
                source: Box::new(e),
            })?;
        if let Some(existing) = self.drivers.get(name)
            && existing.highest_version >= new
        {
            return Err(CsiError::AlreadyRegistered {
                caller,
                driver: name.to_string(),
                existing: existing.highest_version,
            });
        }
        Ok(new)
    }
}

#[async_trait::async_trait]
impl PluginHandler for RegistrationHandler {
    async fn validate(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), PluginError> {
        tracing::info!(driver = name, endpoint, versions = %versions.join(","), "trying to validate a new CSI driver");
        self.validate_versions("ValidatePlugin", name, versions)
            .map(|_| ())
            .map_err(|e| {
                PluginError::from(CsiError::Validation {
                    driver: name.to_string(),
                    endpoint: endpoint.to_string(),
                    source: Box::new(e),
                })
            })
    }

    async fn register(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), PluginError> {
        tracing::info!(driver = name, endpoint, "registering new CSI driver");
        let version = self
            .validate_versions("RegisterPlugin", name, versions)
            .map_err(PluginError::from)?;
        let node = (self.connect)(endpoint);
        self.drivers.set(
            name,
            Driver {
                endpoint: endpoint.to_string(),
                highest_version: version,
                node: node.clone(),
            },
        );
        let info = match node.node_get_info().await {
            Ok(i) => i,
            Err(e) => {
                self.drivers.remove(name);
                return Err(CsiError::Rpc(e).into());
            }
        };
        if let Some(api) = &self.node_info
            && let Err(e) = api
                .install(
                    name,
                    &info.node_id,
                    info.max_volumes_per_node,
                    &info.topology,
                )
                .await
        {
            self.drivers.remove(name);
            return Err(CsiError::NodeInfo(e).into());
        }
        Ok(())
    }

    async fn deregister(&self, name: &str) {
        tracing::info!(
            driver = name,
            "registrationHandler.DeRegisterPlugin request for plugin"
        );
        self.drivers.remove(name);
        if let Some(api) = &self.node_info
            && let Err(e) = api.uninstall(name).await
        {
            tracing::error!(driver = name, error = %e, "{}", log("registrationHandler.DeRegisterPlugin failed"));
        }
    }
}

#[cfg(test)]
mod tests;
