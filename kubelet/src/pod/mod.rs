//! Desired pods and where they come from: static manifests ([`static_pods`]), the apiserver's
//! pods bound to this node ([`api`]), the mirror pods that show static pods on the apiserver
//! ([`mirror`]), and the admission every source's pods pass ([`admission`]).

pub mod admission;
pub mod api;
pub mod mirror;
pub mod static_pods;
pub use admission::Admission;
pub use admission::fields::refusal as field_refusal;
pub use admission::sysctl::Allowlist as SysctlAllowlist;
pub use static_pods::{Admitter as StaticPodAdmitter, run as run_static_pods};
