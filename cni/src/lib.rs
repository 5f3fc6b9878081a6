//! CNI network configuration for the node: writes the conflist the container runtime reads.
