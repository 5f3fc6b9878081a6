#!/usr/bin/env bash
# build-test-images.sh: offline OCI image tarballs of the project's own test programs, for the
# e2e tests (not imported by `rig.sh up`: tests import what they need into their rig).
#
#   build-test-images.sh grpc-health BINARY OUT.tar        build registry.local/grpc-health:1
#   build-test-images.sh import OUT.tar CONTAINERD_SOCK    import a tarball into ns k8s.io
#
# grpc-health: the binary of tests/src/bin/grpc-health-server.rs as /grpc-health-server
# (Entrypoint), plus /tmp. A static binary is copied alone; a dynamic one is copied with every
# shared library `ldd` lists and its program interpreter, at the same paths, so it runs in an
# otherwise empty rootfs. Skipped when OUT.tar.stamp matches (hash of the binary, this script
# and mkimage.sh); locked with flock on OUT.tar.lock so parallel tests can share OUT.tar.
set -euo pipefail
umask 022

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GRPC_IMAGE=registry.local/grpc-health:1

die() { echo "build-test-images: error: $*" >&2; exit 1; }
log() { echo "build-test-images: $*" >&2; }

# copy_with_libs BINARY ROOTFS DEST: BINARY as ROOTFS/DEST, with its shared libraries.
copy_with_libs() {
	local bin=$1 r=$2 dest=$3 lib
	install -D -m 0755 "$bin" "$r/$dest"
	# Debug builds carry debug info: strip it, the layer is gzipped on every rebuild.
	strip -s "$r/$dest" 2>/dev/null || true
	if ! ldd "$bin" >/dev/null 2>&1; then
		log "$bin is static"
		return 0
	fi
	# Lines look like "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
	# "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
	while read -r lib; do
		[[ -n $lib && $lib == /* ]] || continue
		[[ -e $lib ]] || die "ldd names $lib, which does not exist"
		mkdir -p "$r/$(dirname "$lib")"
		cp -L "$lib" "$r/$lib"
		chmod 0755 "$r/$lib"
	done < <(ldd "$bin" | sed -n -e 's/.*=> \(\/[^ ]*\) (.*/\1/p' -e 's/^[[:space:]]*\(\/[^ ]*\) (.*/\1/p')
}

cmd_grpc_health() {
	local bin=$1 out=$2 stamp tmp r
	[[ -x $bin ]] || die "$bin is not an executable (build it: cargo build --bins)"
	[[ $out == *.tar ]] || die "output must end in .tar"
	mkdir -p "$(dirname "$out")"
	exec 8>"$out.lock"
	flock -w 300 8 || die "timed out waiting for $out.lock"
	stamp=$({ echo "$GRPC_IMAGE"; sha256sum "$bin" "$SRC/mkimage.sh" "${BASH_SOURCE[0]}" | cut -d' ' -f1; } | sha256sum | cut -d' ' -f1)
	if [[ -s $out && -f $out.stamp && $(cat "$out.stamp") == "$stamp" ]]; then
		log "$GRPC_IMAGE up to date ($out)"
		echo "$GRPC_IMAGE $out"
		return 0
	fi
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/grpc-image.XXXXXX")
	r=$tmp/rootfs
	mkdir -p "$r/tmp" "$r/proc" "$r/sys" "$r/dev" "$r/etc"
	chmod 1777 "$r/tmp"
	printf 'root:x:0:0:root:/:/grpc-health-server\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$r/etc/passwd"
	printf 'root:x:0:\nnobody:x:65534:\n' >"$r/etc/group"
	copy_with_libs "$bin" "$r" grpc-health-server
	"$SRC/mkimage.sh" "$r" "$GRPC_IMAGE" "$out" '["/grpc-health-server"]' '["--port","9090"]' '' >/dev/null \
		|| { rm -rf "$tmp"; die "mkimage failed"; }
	rm -rf "$tmp"
	echo "$stamp" >"$out.stamp"
	log "built $out ($GRPC_IMAGE)"
	echo "$GRPC_IMAGE $out"
}

cmd_import() {
	local tar=$1 sock=$2
	[[ -S $sock ]] || die "$sock is not a socket"
	ctr -a "$sock" -n k8s.io images import --all-platforms "$tar" >&2
}

case ${1:-} in
grpc-health) [[ $# == 3 ]] || die "usage: build-test-images.sh grpc-health BINARY OUT.tar"; cmd_grpc_health "$2" "$3" ;;
import) [[ $# == 3 ]] || die "usage: build-test-images.sh import OUT.tar CONTAINERD_SOCK"; cmd_import "$2" "$3" ;;
*) sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
