#!/usr/bin/env bash
# Builds the node agent's Debian packages with dpkg-deb:
#   target/debian/node-agent-kubelet_<version>_<arch>.deb
#       /usr/bin/kubelet, kubelet.service, /etc/default/kubelet, /usr/bin/node-agent-cni (the
#       CNI plugin the kubelet installs with --node-agent-cni) and the drop-in
#       kubelet.service.d/09-node-agent-kubeadm.conf (kubeadm's command line, for nodes without
#       kubeadm's package; see below)
#   target/debian/node-agent-kube-proxy_<version>_<arch>.deb
#       /usr/bin/kube-proxy, kube-proxy.service, /etc/default/kube-proxy
# They live beside upstream's kubeadm and kubectl packages:
# - Their names are our own, so `apt upgrade` never swaps in upstream's `kubelet` package
#   (a package of another name is no upgrade of ours). Each `Provides` the upstream name at
#   the Kubernetes version it stands in for (kubeadm's package `Depends: kubelet (>= …)`), and
#   `Conflicts`/`Replaces` it: one kubelet per node, and installing ours over upstream's takes
#   over /usr/bin/kubelet and its unit.
# - kubeadm's package owns kubelet.service.d/10-kubeadm.conf. Ours ships the same command line
#   as 09-node-agent-kubeadm.conf: systemd applies drop-ins in name order, so where kubeadm's
#   file exists its ExecStart (the same line) comes last and wins; where it does not, ours
#   starts the agent as kubeadm would. No file belongs to two packages.
# - `Recommends` names what the proxy modes and pod networking use.
# <version> is the Kubernetes release the agent stands in for, with the agent's own version as
# the Debian revision (1.36.0-agent0.1.0).
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

# control NAME UPSTREAM DEPENDS RECOMMENDS DESCRIPTION
control() {
	mkdir -p "$work/$1/DEBIAN"
	cat >"$work/$1/DEBIAN/control" <<EOF
Package: $1
Version: $version
Architecture: $arch
Maintainer: node agent developers <root@localhost>
Section: admin
Priority: optional
Depends: $3
Recommends: $4
Provides: $2 (= $k8s)
Conflicts: $2
Replaces: $2
Homepage: https://kubernetes.io/
Description: $5
 A Rust node agent that stands in for Kubernetes $k8s's $2: same flags,
 configuration, ports and wire behaviour. Installs beside upstream's kubeadm
 and kubectl packages.
EOF
	# Files under /etc are the administrator's: dpkg keeps their edits across upgrades.
	(cd "$work/$1" && find etc -type f -printf '/%p\n' | sort) >"$work/$1/DEBIAN/conffiles"
	[[ -s $work/$1/DEBIAN/conffiles ]] || rm "$work/$1/DEBIAN/conffiles"
}

install_file() { # MODE SRC PKG DEST
	install -D -m "$1" "$2" "$work/$3$4"
}

# default_file PKG NAME VAR: /etc/default/NAME with an empty VAR=, as upstream's kubelet
# package ships /etc/default/kubelet (KUBELET_EXTRA_ARGS=).
default_file() {
	install -d -m 0755 "$work/$1/etc/default"
	printf '%s=\n' "$3" >"$work/$1/etc/default/$2"
	chmod 0644 "$work/$1/etc/default/$2"
}

kubelet_pkg=node-agent-kubelet
proxy_pkg=node-agent-kube-proxy

install_file 0755 "$bin_dir/kubelet" $kubelet_pkg /usr/bin/kubelet
install_file 0755 "$bin_dir/node-agent-cni" $kubelet_pkg /usr/bin/node-agent-cni
install_file 0644 "$units/kubelet.service" $kubelet_pkg /usr/lib/systemd/system/kubelet.service
install_file 0644 "$units/09-node-agent-kubeadm.conf" $kubelet_pkg \
	/usr/lib/systemd/system/kubelet.service.d/09-node-agent-kubeadm.conf
install -d -m 0755 "$work/$kubelet_pkg/etc/kubernetes/manifests"
default_file $kubelet_pkg kubelet KUBELET_EXTRA_ARGS
control $kubelet_pkg kubelet "libc6, mount" \
	"containernetworking-plugins, conntrack, iptables, iproute2, util-linux" \
	"Kubernetes node agent (kubelet)"

install_file 0755 "$bin_dir/kube-proxy" $proxy_pkg /usr/bin/kube-proxy
install_file 0644 "$units/kube-proxy.service" $proxy_pkg /usr/lib/systemd/system/kube-proxy.service
default_file $proxy_pkg kube-proxy KUBE_PROXY_ARGS
control $proxy_pkg kube-proxy "libc6, iptables, conntrack" "nftables, ipset" \
	"Kubernetes network proxy (kube-proxy)"

for p in $kubelet_pkg $proxy_pkg; do
	find "$work/$p" -type d -exec chmod 0755 {} +
	chmod 0644 "$work/$p/DEBIAN/"*
	deb="$out/${p}_${version}_${arch}.deb"
	dpkg-deb --root-owner-group "${compress[@]}" --build "$work/$p" "$deb" >/dev/null
	echo "$deb"
done
