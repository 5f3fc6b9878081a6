//! End-to-end tests and their helpers: the node rig and (later) a test control plane.
