//! The kubelet: pod sources, per-pod workers reconciling against a CRI runtime, and its servers.
