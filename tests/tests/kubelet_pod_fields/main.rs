//! Pod fields on real containerd, through the test control plane: each module covers one
//! group of fields (in-place resize in `resize`).

mod resize;
