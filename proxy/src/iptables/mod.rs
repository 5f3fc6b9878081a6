//! The iptables mode (upstream's pkg/proxy/iptables, with the runner of pkg/util/iptables).
//!
//! - [`runner`]: the OS edge, `IptablesRunner` (iptables, iptables-save, iptables-restore)
//!   and its `ExecRunner`, the [`Variant`] detection (nft or legacy);
//! - [`xtables_lock`]: one command of the process at a time, holding the node's xtables lock
//!   where the binary does not;
//! - [`chains`]: chain names, fixed and hashed per service;
//! - [`ruleset`]: the rules as data, printed whole or as a minimal delta;
//! - [`render`]: desired state → rules, kept per service (`Rendered`) for partial syncs;
//! - [`proxier`]: [`IptablesBackend`], this mode's [`crate::proxier::Backend`] (render,
//!   check the jumps, apply), and [`Proxier`], the generic proxier over it;
//! - [`cleanup`]: what `--cleanup` removes, and how.
//!
//! The other modes have folders of their own beside this one (`nftables/`, `ipvs/`), on
//! the same shared modules (`proxier`, `tracker`, `topology`, `nodeport`, `sync_loop`).

pub mod chains;
pub mod cleanup;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod proxier;
pub mod render;
pub mod ruleset;
pub mod runner;
pub mod xtables_lock;

#[cfg(test)]
mod tests;

pub use proxier::{IptablesBackend, Proxier};
pub use render::Rendered;
pub use ruleset::Ruleset;
pub use runner::{
    Error, ExecRunner, IptablesRunner, IptablesVersion, Position, Result, TableName, Variant,
    VariantDecision, command_timeout, decide_variant, detect_variant,
};
pub use xtables_lock::{Gated, XtablesGate};
