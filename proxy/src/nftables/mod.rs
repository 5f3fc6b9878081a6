//! The nftables mode (upstream's pkg/proxy/nftables): one `kube-proxy` table per family
//! (`ip`, `ip6`), verdict maps for service IPs and node ports, per-service and per-endpoint
//! chains named as upstream names them.
//!
//! - [`names`]: table, map and chain names (upstream's hashing and truncation);
//! - [`render`]: desired state → the fixed part of the table and each service port's
//!   objects (pure);
//! - [`tx`]: what the kernel holds ([`tx::KernelState`]) and the transactions between two
//!   states (a table written afresh, or only the difference; stale chains deleted a second
//!   later);
//! - [`runner`]: the OS edge, `nft -f -` with a timeout, and the kernel support check;
//! - [`proxier`]: [`NftBackend`], this mode's [`crate::proxier::Backend`], and
//!   [`NftProxier`], the generic proxier over it;
//! - [`cleanup`]: what `--cleanup` and a mode switch remove.

pub mod cleanup;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod names;
pub mod proxier;
pub mod render;
pub mod runner;
pub mod tx;

#[cfg(test)]
mod tests;

pub use proxier::{NftBackend, NftProxier};
pub use runner::{ExecNft, NftRunner, Unsupported, check_support};
