//! Pod admission: whether a pod may run on this node (resource fit, sysctls).

pub mod fit;
pub mod sysctl;
