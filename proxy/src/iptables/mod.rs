//! The iptables mode (upstream's pkg/proxy/iptables, with the runner of pkg/util/iptables).
//!
//! - the OS edge, `IptablesRunner` (iptables, iptables-save, iptables-restore), its
//!   `ExecRunner`, the [`Variant`] detection (nft or legacy) and the xtables lock, live in
//!   `plumbing::iptables`: the kubelet runs its own chains through them too;
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
pub mod proxier;
pub mod render;
pub mod ruleset;

#[cfg(test)]
mod tests;

pub use plumbing::iptables::{
    Error, ExecRunner, IptablesRunner, IptablesVersion, Position, Result, TableName, Variant,
    VariantDecision, command_timeout, decide_variant, detect_variant,
};
pub use plumbing::iptables::{Gated, XtablesGate};
pub use proxier::{IptablesBackend, Proxier};
pub use render::Rendered;
pub use ruleset::Ruleset;
