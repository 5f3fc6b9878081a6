//! Desired pods and where they come from: static manifests ([`static_pods`]), the apiserver's
//! pods bound to this node ([`api`]), the mirror pods that show static pods on the apiserver
//! ([`mirror`]), and the one pipeline every source's complete set goes through
//! ([`pipeline`]): merged, admitted once ([`admission`]), then to the sync loop.

pub mod admission;
pub mod api;
pub mod mirror;
pub mod pipeline;
pub mod static_pods;
pub use admission::Admission;
pub use admission::fields::refusal as field_refusal;
pub use admission::sysctl::Allowlist as SysctlAllowlist;
pub use pipeline::{Outputs as PipelineOutputs, Pipeline};
pub use static_pods::run as run_static_pods;
