#!/usr/bin/env bash
# Builds the node agent's Debian packages with dpkg-deb:
#   target/debian/kubelet_<version>_<arch>.deb     /usr/bin/kubelet, kubelet.service,
#                                                  kubeadm's drop-in 10-kubeadm.conf and
#                                                  /usr/bin/node-agent-cni (the CNI plugin the
#                                                  kubelet installs with --node-agent-cni)
#   target/debian/kube-proxy_<version>_<arch>.deb  /usr/bin/kube-proxy, kube-proxy.service
# where kubeadm's own packages put them. <version> is the Kubernetes release the agent stands
# in for, with the agent's own version as the Debian revision (1.36.0-agent0.1.0).
#
# usage: systemd/package.sh [--bin-dir DIR] [--out DIR] [--fast]
#   --bin-dir  where the built binaries are (default: target/release, built if missing)
#   --out      where the .deb files go (default: target/debian)
#   --fast     gzip -1 instead of xz (tests package debug binaries)
set -euo pipefail
# Modes in the packages never depend on the packager's umask: directories are 0755 and files
# get the modes install_file names (a umask of 002 would make /etc/kubernetes/manifests
# group-writable on every node that installs the package).
umask 022
root=$(cd "$(dirname "$0")/.." && pwd)
bin_dir=$root/target/release
out=$root/target/debian
compress=(-Zxz)
while (($#)); do
	case $1 in
	--bin-dir) bin_dir=$(cd "$2" && pwd); shift 2 ;;
	--out) mkdir -p "$2" && out=$(cd "$2" && pwd); shift 2 ;;
	--fast) compress=(-Zgzip -z1); shift ;;
	*) echo "package.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
	esac
done
command -v dpkg-deb >/dev/null || { echo "package.sh: dpkg-deb is required" >&2; exit 1; }

if [[ $bin_dir == "$root/target/release" && ! -x $bin_dir/kubelet ]]; then
	(cd "$root" && cargo build --release -p kubelet -p proxy -p cni --bins)
fi
for b in kubelet kube-proxy node-agent-cni; do
	[[ -x $bin_dir/$b ]] || { echo "package.sh: $bin_dir/$b is missing (build it first)" >&2; exit 1; }
done

k8s=$("$bin_dir/kubelet" --version | sed -n 's/^Kubernetes v//p')
[[ -n $k8s ]] || { echo "package.sh: could not read the version from kubelet --version" >&2; exit 1; }
agent=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
version="$k8s-agent$agent"
arch=$(dpkg --print-architecture)
units=$root/systemd/units
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# control NAME DEPENDS DESCRIPTION
control() {
	mkdir -p "$work/$1/DEBIAN"
	cat >"$work/$1/DEBIAN/control" <<EOF
Package: $1
Version: $version
Architecture: $arch
Maintainer: node agent developers <root@localhost>
Section: admin
Priority: optional
Depends: $2
Homepage: https://kubernetes.io/
Description: $3
 A Rust node agent that stands in for Kubernetes $k8s's $1: same flags,
 configuration, ports and wire behaviour.
EOF
}

install_file() { # MODE SRC PKG DEST
	install -D -m "$1" "$2" "$work/$3$4"
}

control kubelet "libc6, mount" "Kubernetes node agent (kubelet)"
install_file 0755 "$bin_dir/kubelet" kubelet /usr/bin/kubelet
install_file 0755 "$bin_dir/node-agent-cni" kubelet /usr/bin/node-agent-cni
install_file 0644 "$units/kubelet.service" kubelet /usr/lib/systemd/system/kubelet.service
install_file 0644 "$units/10-kubeadm.conf" kubelet /usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf
install -d -m 0755 "$work/kubelet/etc/kubernetes/manifests"

control kube-proxy "libc6, iptables, conntrack" "Kubernetes network proxy (kube-proxy)"
install_file 0755 "$bin_dir/kube-proxy" kube-proxy /usr/bin/kube-proxy
install_file 0644 "$units/kube-proxy.service" kube-proxy /usr/lib/systemd/system/kube-proxy.service

for p in kubelet kube-proxy; do
	find "$work/$p" -type d -exec chmod 0755 {} +
	chmod 0644 "$work/$p/DEBIAN/control"
	deb="$out/${p}_${version}_${arch}.deb"
	dpkg-deb --root-owner-group "${compress[@]}" --build "$work/$p" "$deb" >/dev/null
	echo "$deb"
done
