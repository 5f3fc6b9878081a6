//! Pod fields on real containerd, through the test control plane (issue 27): each field
//! either has an effect that is checked from inside the containers, or a refusal.

mod ephemeral;
mod resize;
