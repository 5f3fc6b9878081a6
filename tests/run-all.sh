#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh Debian 12 machine (root), builds
# the workspace, checks formatting and lints, and runs every test (unit, golden, e2e on the
# node rig). Tests that need something this machine lacks print why they skip.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TERM_COLOR=never
# One-shot builds gain nothing from incremental caches, which would double the target's size.
export CARGO_INCREMENTAL=0

if [[ $(id -u) == 0 ]]; then
	tests/rig/rig.sh install
	tests/rig/rig.sh images
else
	echo "run-all: not root: the node-rig and network-namespace tests will skip (they say why)"
fi
# The Rust toolchain is pinned in rust-toolchain.toml (rustup installs it on first use where
# it can); python3 runs the layout check and the Python gRPC e2e.
command -v cargo >/dev/null || { echo "run-all: cargo (rustup, see rust-toolchain.toml) is required" >&2; exit 1; }
if ! command -v python3 >/dev/null; then
	[[ $(id -u) == 0 ]] || { echo "run-all: python3 is required" >&2; exit 1; }
	echo "run-all: installing python3"
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 >/dev/null
fi

echo "run-all: cargo fmt --check"
cargo fmt --all -- --check
echo "run-all: layout (import circles, file sizes, kubelet layers)"
python3 tests/check_layout.py
echo "run-all: free disk: $(df -h --output=avail . | tail -1 | tr -d ' ')"
# Bins and tests in one build: one feature resolution (dev-dependencies included), so
# `cargo test` below reuses every artifact instead of compiling the tree a second time.
echo "run-all: cargo build --bins --tests"
cargo build --workspace --bins --tests
echo "run-all: cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "run-all: cargo test"
# e2e tests start their own rigs; two at a time keeps a 2-core machine responsive.
cargo test --workspace --no-fail-fast -- --test-threads="${TEST_THREADS:-2}"
