//! Pod fields on real containerd (issue 27), one module per group of fields beside this file:
//! each field either has an effect checked from inside the containers, or the refusal the pod
//! gets where containerd 1.6 cannot provide it.

mod ephemeral;
mod mounts;
mod resize;
mod userns;
