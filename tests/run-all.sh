#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh Debian 12 machine (root), builds
# the workspace, checks formatting and lints, and runs every test (unit, golden, e2e on the
# node rig). Tests that need something this machine lacks print why they skip.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TERM_COLOR=never

if [[ $(id -u) == 0 ]]; then
	tests/rig/rig.sh install
	tests/rig/rig.sh images
else
	echo "run-all: not root: the node-rig and network-namespace tests will skip (they say why)"
fi
command -v cargo >/dev/null || { echo "run-all: cargo is required" >&2; exit 1; }

echo "run-all: cargo fmt --check"
cargo fmt --all -- --check
echo "run-all: cargo build --bins"
cargo build --workspace --bins
echo "run-all: cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "run-all: cargo test"
# e2e tests start their own rigs; two at a time keeps a 2-core machine responsive.
cargo test --workspace --no-fail-fast -- --test-threads="${TEST_THREADS:-2}"
