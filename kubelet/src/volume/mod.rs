//! Pod volumes on the node. Today: subPath mounts resolved beneath their volume
//! ([`subpath`]); the desired/actual-state volume manager and one module per volume kind
//! (emptyDir, hostPath, configMap, secret, projected, downwardAPI) grow here.

pub mod ownership;
pub mod subpath;
