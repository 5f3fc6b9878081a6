#!/usr/bin/env bash
# mkimage.sh: package a root filesystem directory as an offline OCI image-layout
# tarball that `ctr images import` (and so containerd's CRI image store) accepts.
#
#   mkimage.sh <rootfs-dir> <reference> <out.tar> [entrypoint-json] [cmd-json] [user]
#
#   rootfs-dir       directory whose contents become the single layer (owner forced to 0:0)
#   reference        full image reference, e.g. registry.k8s.io/pause:3.10 (no digests)
#   out.tar          output tarball (written atomically)
#   entrypoint-json  JSON array or "" / null (default: none)
#   cmd-json         JSON array or "" / null (default: none)
#   user             config User, e.g. "65535:65535" (default: none = root)
#
# Optional environment:
#   MKIMAGE_ENV      JSON array for config Env (default: a standard PATH)
#   MKIMAGE_WORKDIR  config WorkingDir (default: none)
#   MKIMAGE_ARCH     architecture (default: from dpkg --print-architecture / uname -m)
#
# Output is deterministic: the same rootfs gives byte-identical blobs (tar with
# mtime 0, uid/gid 0, sorted names; gzip -n). No jq, no python: JSON is written by hand.
set -euo pipefail
umask 022

die() { echo "mkimage.sh: $*" >&2; exit 1; }

[[ $# -ge 3 && $# -le 6 ]] || die "usage: mkimage.sh <rootfs-dir> <reference> <out.tar> [entrypoint-json] [cmd-json] [user]"
rootfs=$1 ref=$2 out=$3 entrypoint=${4:-} cmd=${5:-} user=${6:-}

[[ -d $rootfs ]] || die "rootfs $rootfs is not a directory"
# A reference we can put into JSON without escaping: [registry/]path[:tag].
[[ $ref =~ ^[a-z0-9]([a-z0-9._:-]*[a-z0-9])?(/[a-z0-9._-]+)+(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?$ ]] \
	|| die "reference '$ref' is not of the form registry/path[:tag] (lowercase, no digest)"
[[ $ref == */* ]] || die "reference '$ref' must include the registry (e.g. docker.io/library/x:tag)"
last=${ref##*/}
if [[ $last == *:* ]]; then tag=${last##*:}; else tag=latest; ref="$ref:latest"; fi

json_array_or_null() { # validate loosely: a JSON array of strings, or empty/null
	local v=$1 what=$2
	if [[ -z $v || $v == null ]]; then echo null; return; fi
	[[ $v =~ ^\[.*\]$ ]] || die "$what must be a JSON array, got: $v"
	echo "$v"
}
entrypoint=$(json_array_or_null "$entrypoint" entrypoint)
cmd=$(json_array_or_null "$cmd" cmd)
[[ $user =~ ^[A-Za-z0-9_.:-]*$ ]] || die "user '$user' has unsupported characters"
env_json=$(json_array_or_null "${MKIMAGE_ENV:-[\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"]}" MKIMAGE_ENV)
workdir=${MKIMAGE_WORKDIR:-}
[[ $workdir =~ ^[A-Za-z0-9_./-]*$ ]] || die "MKIMAGE_WORKDIR has unsupported characters"

arch=${MKIMAGE_ARCH:-}
if [[ -z $arch ]]; then
	if command -v dpkg >/dev/null 2>&1; then arch=$(dpkg --print-architecture)
	else case $(uname -m) in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; *) arch=$(uname -m) ;; esac
	fi
fi
case $arch in amd64|arm64|ppc64el|s390x|riscv64) ;; *) die "unsupported architecture $arch" ;; esac
[[ $arch == ppc64el ]] && arch=ppc64le

work=$(mktemp -d "${TMPDIR:-/tmp}/mkimage.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/layout/blobs/sha256"
blobs=$work/layout/blobs/sha256

# put_blob FILE -> moves FILE into blobs/, prints "<hex> <size>"
put_blob() {
	local f=$1 hex size
	hex=$(sha256sum "$f" | cut -d' ' -f1)
	size=$(stat -c %s "$f")
	mv -f "$f" "$blobs/$hex"
	echo "$hex $size"
}

# 1. the layer: deterministic tar of the rootfs contents, then gzip -n.
tar -C "$rootfs" --mtime=@0 --owner=0 --group=0 --numeric-owner --sort=name \
	--format=gnu -cf "$work/layer.tar" .
diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
gzip -n -9 -c "$work/layer.tar" >"$work/layer.tar.gz"
rm -f "$work/layer.tar"
read -r layer_hex layer_size < <(put_blob "$work/layer.tar.gz")

# 2. the image config.
cfg="{\"Env\":$env_json"
[[ $entrypoint != null ]] && cfg+=",\"Entrypoint\":$entrypoint"
[[ $cmd != null ]] && cfg+=",\"Cmd\":$cmd"
[[ -n $user ]] && cfg+=",\"User\":\"$user\""
[[ -n $workdir ]] && cfg+=",\"WorkingDir\":\"$workdir\""
cfg+="}"
printf '{"created":"1970-01-01T00:00:00Z","architecture":"%s","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"tests/rig/mkimage.sh"}]}' \
	"$arch" "$cfg" "$diff_id" >"$work/config.json"
read -r config_hex config_size < <(put_blob "$work/config.json")

# 3. the manifest.
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
	"$config_hex" "$config_size" "$layer_hex" "$layer_size" >"$work/manifest.json"
read -r manifest_hex manifest_size < <(put_blob "$work/manifest.json")

# 4. index.json + oci-layout.
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
	"$manifest_hex" "$manifest_size" "$arch" "$ref" "$tag" >"$work/layout/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"

# 5. the outer tarball, also deterministic; written next to the target then renamed.
mkdir -p "$(dirname "$out")"
tmp_out=$(mktemp "$(dirname "$out")/.mkimage.XXXXXX")
tar -C "$work/layout" --mtime=@0 --owner=0 --group=0 --numeric-owner --sort=name \
	--format=gnu -cf "$tmp_out" oci-layout index.json blobs
chmod 0644 "$tmp_out"
mv -f "$tmp_out" "$out"
echo "$ref sha256:$manifest_hex $out"
