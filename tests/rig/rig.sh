#!/usr/bin/env bash
# rig.sh: the node rig. A private containerd (CRI) inside its own network namespace, with
# offline images, for the demo, the e2e tests and CI. See tests/rig/README.md.
#
#   rig.sh install                  install missing Debian packages, and grpcio + grpcio-tools
#                                   from PyPI into $RIG_HOME/pyvenv (the Python gRPC e2e)
#   rig.sh images [DIR]             build the offline OCI image tarballs (skips when up to date)
#   rig.sh up NAME                  netns + containerd + CNI config + images; prints env lines
#   rig.sh down NAME                idempotent teardown (also after a crash)
#   rig.sh down-all                 tear down every rig under RIG_HOME
#   rig.sh status NAME              does containerd answer?
#   rig.sh restart-containerd NAME [--kill]   restart containerd only (shims/containers stay)
#   rig.sh env NAME                 print the env lines of a running rig
#   rig.sh list                     names of the rigs recorded under RIG_HOME
#
# Never touches the root network namespace: every networked thing lives in netns NAME.
set -euo pipefail
umask 022
if [[ ${RIG_TRACE:-0} == 1 ]]; then
	PS4='+ ${EPOCHREALTIME} ${FUNCNAME[0]:-main}: '
	set -x
fi

RIG_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RIG_HOME=${RIG_HOME:-/var/tmp/node-rig}
RIG_POD_CIDR=${RIG_POD_CIDR:-10.88.0.0/16}
RIG_LOG_LEVEL=${RIG_LOG_LEVEL:-info}
CNI_BIN_DIR=${CNI_BIN_DIR:-/usr/lib/cni}
RUNC_BIN=${RUNC_BIN:-/usr/sbin/runc}
SANDBOX_IMAGE=registry.k8s.io/pause:3.10
BUSYBOX_IMAGE=docker.io/library/busybox:1.35
# Bump when the image recipes below change (the stamp also hashes pause.c, mkimage.sh, busybox).
IMAGE_RECIPE=1
CTR_NS=k8s.io

log() { echo "rig: $*" >&2; }
die() { echo "rig: error: $*" >&2; exit 1; }

usage() {
	sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

need_root() { [[ $(id -u) == 0 ]] || die "must run as root"; }

check_name() {
	[[ ${1:-} =~ ^[a-z0-9][a-z0-9-]{0,30}$ ]] \
		|| die "rig name '${1:-}' must match [a-z0-9][a-z0-9-]{0,30}"
}

check_home() {
	[[ $RIG_HOME == /* && $RIG_HOME =~ ^[A-Za-z0-9_./-]+$ ]] \
		|| die "RIG_HOME '$RIG_HOME' must be an absolute path without spaces or special characters"
	[[ $RIG_HOME != / ]] || die "RIG_HOME must not be /"
}

boot_id() { cat /proc/sys/kernel/random/boot_id; }

# Per-rig paths.
set_paths() {
	NAME=$1
	RIG_DIR=$RIG_HOME/$NAME
	NETNS_PATH=/run/netns/$NAME
	SOCK=$RIG_DIR/containerd.sock
	CONF=$RIG_DIR/containerd.toml
	PIDFILE=$RIG_DIR/containerd.pid
	LOGDIR=$RIG_DIR/logs
	CD_LOG=$LOGDIR/containerd.log
	RUNC_ROOT=$RIG_DIR/runc
	CNI_CONF_DIR=$RIG_DIR/cni/net.d
	IPAM_DIR=$RIG_DIR/cni/ipam
	ENVFILE=$RIG_DIR/env
	MARKER=$RIG_DIR/.node-rig
	CGROUP_ROOT=/rig-$NAME
	RIG_IMAGES=${RIG_IMAGES:-$RIG_HOME/images}
	((${#SOCK} < 100)) || die "socket path $SOCK is too long for a unix socket"
}

# Serialise up/down/restart of one rig (fd 9; closed for containerd so it never holds it).
lock_rig() {
	mkdir -p "$RIG_HOME"
	exec 9>"$RIG_HOME/.$NAME.lock"
	flock -w 120 9 || die "timed out waiting for the lock of rig $NAME"
}

# ---------------------------------------------------------------------------------------------
# install

# pkg:check pairs; a check is a command name or an absolute path that must exist.
INSTALL_SPEC=(
	"containerd:containerd" "containerd:ctr" "containerd:containerd-shim-runc-v2"
	"runc:runc"
	"containernetworking-plugins:$CNI_BIN_DIR/bridge"
	"containernetworking-plugins:$CNI_BIN_DIR/host-local"
	"containernetworking-plugins:$CNI_BIN_DIR/portmap"
	"containernetworking-plugins:$CNI_BIN_DIR/loopback"
	"iptables:iptables" "iptables:iptables-save"
	"nftables:nft"
	"conntrack:conntrack"
	"iproute2:ip"
	"util-linux:nsenter" "util-linux:findmnt" "util-linux:flock" "util-linux:setsid"
	"gcc:gcc"
	"libc6-dev:/usr/include/stdio.h"
	"binutils:readelf"
	"tar:tar" "gzip:gzip" "coreutils:sha256sum"
	"curl:curl"
	# The IPVS traffic e2e (proxy/tests/netns_ipvs.rs); it still skips, saying why, on a
	# kernel without ip_vs.
	"ipset:ipset" "procps:sysctl"
)

busybox_is_static() {
	[[ -x /bin/busybox ]] || return 1
	if command -v readelf >/dev/null 2>&1; then
		! readelf -l /bin/busybox 2>/dev/null | grep -q 'program interpreter'
	else
		dpkg-query -W -f='${db:Status-Abbrev}' busybox-static 2>/dev/null | grep -q '^ii'
	fi
}

cmd_install() {
	need_root
	local missing=() spec pkg check
	for spec in "${INSTALL_SPEC[@]}"; do
		pkg=${spec%%:*} check=${spec#*:}
		if [[ $check == /* ]]; then [[ -e $check ]] && continue
		else command -v "$check" >/dev/null 2>&1 && continue
		fi
		[[ " ${missing[*]-} " == *" $pkg "* ]] || missing+=("$pkg")
	done
	# libc.a is needed for gcc -static.
	compgen -G '/usr/lib/*/libc.a' >/dev/null || compgen -G '/usr/lib/libc.a' >/dev/null \
		|| [[ " ${missing[*]-} " == *" libc6-dev "* ]] || missing+=(libc6-dev)
	busybox_is_static || missing+=(busybox-static)
	# The Python gRPC e2e runs in a venv: python3 with venv's ensurepip.
	python3 -c 'import venv, ensurepip' >/dev/null 2>&1 \
		|| missing+=(python3 python3-venv)
	if ((${#missing[@]} == 0)); then
		log "install: all packages present"
		install_python_grpc
		return 0
	fi
	log "install: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	# Do not let package scripts start a system containerd (no service starts during install).
	local policy=/usr/sbin/policy-rc.d added_policy=0
	if [[ ! -e $policy ]]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && added_policy=1
	fi
	local rc=0
	{
		apt-get update -qq &&
			apt-get install -y -qq --no-install-recommends \
				-o Dpkg::Options::=--force-confold "${missing[@]}"
	} >/dev/null || rc=$?
	((added_policy)) && rm -f "$policy"
	((rc == 0)) || die "apt-get install ${missing[*]} failed (rc $rc)"
	busybox_is_static || die "/bin/busybox is not a static binary after install"
	install_python_grpc
	log "install: done"
}

# grpcio and grpcio-tools from PyPI in $PY_VENV: a gRPC client and plugin not written in Go
# (tests/tests/kubelet_devices.rs). Without PyPI the tests that need it skip and say why.
PY_VENV=${RIG_PY_VENV:-$RIG_HOME/pyvenv}
install_python_grpc() {
	if "$PY_VENV/bin/python3" -c 'import grpc, grpc_tools' >/dev/null 2>&1; then
		return 0
	fi
	log "install: grpcio, grpcio-tools into $PY_VENV"
	if ! { python3 -m venv "$PY_VENV" &&
		timeout 600 "$PY_VENV/bin/python3" -m pip install -q --disable-pip-version-check \
			grpcio grpcio-tools; } >/dev/null 2>&1; then
		log "install: WARNING: pip install grpcio grpcio-tools failed (PyPI unreachable?): the Python gRPC e2e tests will skip"
	fi
}

# ---------------------------------------------------------------------------------------------
# images

image_arch() { dpkg --print-architecture 2>/dev/null || uname -m; }

# stamp_of FILE... : a hash over the inputs of one image build
stamp_of() {
	{
		echo "recipe=$IMAGE_RECIPE arch=$(image_arch)"
		sha256sum "$@"
	} | sha256sum | cut -d' ' -f1
}

up_to_date() { # tarball stamp
	[[ -s $1 && -f $1.stamp && $(cat "$1.stamp") == "$2" ]]
}

build_pause() {
	local dir=$1 out=$1/pause.tar stamp tmp
	stamp=$(stamp_of "$RIG_SRC/pause.c" "$RIG_SRC/mkimage.sh")
	if up_to_date "$out" "$stamp"; then log "images: pause up to date"; return 0; fi
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/rig-pause.XXXXXX")
	mkdir -p "$tmp/rootfs"
	gcc -static -O2 -s -Wall -o "$tmp/rootfs/pause" "$RIG_SRC/pause.c" || { rm -rf "$tmp"; die "gcc failed"; }
	chmod 0755 "$tmp/rootfs/pause"
	"$RIG_SRC/mkimage.sh" "$tmp/rootfs" "$SANDBOX_IMAGE" "$out" '["/pause"]' '' '65535:65535' >/dev/null \
		|| { rm -rf "$tmp"; die "mkimage pause failed"; }
	rm -rf "$tmp"
	echo "$stamp" >"$out.stamp"
	log "images: built $out ($SANDBOX_IMAGE)"
}

build_busybox() {
	local dir=$1 out=$1/busybox.tar stamp tmp r applet
	busybox_is_static || die "/bin/busybox missing or not static (run: rig.sh install)"
	stamp=$(stamp_of /bin/busybox "$RIG_SRC/mkimage.sh")
	if up_to_date "$out" "$stamp"; then log "images: busybox up to date"; return 0; fi
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/rig-busybox.XXXXXX")
	r=$tmp/rootfs
	mkdir -p "$r/bin" "$r/etc" "$r/root" "$r/tmp" "$r/var/www" "$r/proc" "$r/sys" "$r/dev" \
		"$r/home" "$r/usr/bin" "$r/usr/sbin" "$r/sbin"
	cp /bin/busybox "$r/bin/busybox"
	chmod 0755 "$r/bin/busybox"
	while read -r applet; do
		[[ -n $applet && $applet != bin/busybox && $applet != /* && $applet != *..* ]] || continue
		mkdir -p "$r/$(dirname "$applet")"
		[[ -e $r/$applet ]] || ln -s /bin/busybox "$r/$applet"
	done < <(/bin/busybox --list-full)
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$r/etc/passwd"
	printf 'root:x:0:\nnobody:x:65534:\n' >"$r/etc/group"
	chmod 0644 "$r/etc/passwd" "$r/etc/group"
	chmod 0700 "$r/root"
	chmod 1777 "$r/tmp"
	chmod 0755 "$r/var/www" "$r/bin" "$r/etc"
	"$RIG_SRC/mkimage.sh" "$r" "$BUSYBOX_IMAGE" "$out" '' '["sh"]' '' >/dev/null \
		|| { rm -rf "$tmp"; die "mkimage busybox failed"; }
	rm -rf "$tmp"
	echo "$stamp" >"$out.stamp"
	log "images: built $out ($BUSYBOX_IMAGE)"
}

build_images() {
	local dir=$1
	mkdir -p "$dir"
	(
		# fd 8: one builder at a time per images dir (parallel tests share it).
		exec 8>"$dir/.lock"
		flock -w 300 8 || die "timed out waiting for $dir/.lock"
		command -v gcc >/dev/null || die "gcc missing (run: rig.sh install)"
		build_pause "$dir"
		build_busybox "$dir"
	)
}

cmd_images() {
	need_root
	check_home
	local dir=${1:-$RIG_HOME/images}
	[[ $dir == /* ]] || dir=$PWD/$dir
	build_images "$dir"
	echo "$SANDBOX_IMAGE $dir/pause.tar"
	echo "$BUSYBOX_IMAGE $dir/busybox.tar"
}

# ---------------------------------------------------------------------------------------------
# process helpers (by PID only, verified through /proc/PID/cmdline)

# cmdline_has PID STRING: does the NUL-separated argv of PID contain the argument STRING?
cmdline_has() {
	local pid=$1 want=$2 arg
	[[ -r /proc/$pid/cmdline ]] || return 1
	while IFS= read -r -d '' arg; do
		[[ $arg == "$want" ]] && return 0
	done </proc/"$pid"/cmdline 2>/dev/null
	return 1
}

# PID 1, this script and all its ancestors (a test harness may run `down` from inside the
# rig's netns or cgroups: it must not kill its caller).
# proc_stat_field PID N: Nth field after the "(comm)" of /proc/PID/stat (1 = state, 2 = ppid).
proc_stat_field() {
	local st
	st=$(cat /proc/"$1"/stat 2>/dev/null) || { echo 0; return 0; }
	st=${st##*) }
	echo "$st" | cut -d' ' -f"$2"
}
ANCESTORS=
ancestors() {
	local p=$$ n=0
	ANCESTORS=" 1 $$ $BASHPID "
	while [[ $p =~ ^[0-9]+$ && $p -gt 1 && $n -lt 64 ]]; do
		p=$(proc_stat_field "$p" 2)
		ANCESTORS+="$p "
		n=$((n + 1))
	done
}
host_netns_inode() {
	local link= p
	link=$(readlink /proc/1/ns/net 2>/dev/null) || link=
	if [[ -z $link ]]; then
		[[ -n $ANCESTORS ]] || ancestors
		for p in $ANCESTORS; do
			[[ $p == 1 || $p == 0 ]] && continue
			link=$(readlink /proc/"$p"/ns/net 2>/dev/null) || continue
		done
	fi
	link=${link#net:[}
	echo "${link%]}"
}
is_protected_pid() {
	[[ -n $ANCESTORS ]] || ancestors
	[[ $ANCESTORS == *" $1 "* || $1 == "$BASHPID" ]]
}

# stop_pid PID SECONDS: TERM, wait, KILL. Returns when PID is gone.
stop_pid() {
	local pid=$1 secs=${2:-10} i
	is_protected_pid "$pid" && return 0
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < secs * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		# A zombie child of ours counts as gone.
		[[ $(proc_stat_field "$pid" 1) == Z ]] && return 0
		sleep 0.1
	done
	log "pid $pid ignored SIGTERM for ${secs}s: SIGKILL"
	kill -KILL "$pid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		[[ $(proc_stat_field "$pid" 1) == Z ]] && return 0
		sleep 0.1
	done
}

# containerd_pid: the PID of this rig's containerd, or nothing. Trusts the pidfile only when
# the process's argv still holds our config path (guards against PID reuse).
containerd_pid() {
	local pid d
	pid=$(cat "$PIDFILE" 2>/dev/null || true)
	if [[ $pid =~ ^[0-9]+$ ]] && cmdline_has "$pid" "$CONF"; then
		echo "$pid"
		return 0
	fi
	# Pidfile lost or stale (crashed run): find the containerd started with OUR config file.
	for d in /proc/[0-9]*; do
		pid=${d#/proc/}
		[[ $(readlink "$d/exe" 2>/dev/null) == */containerd ]] || continue
		cmdline_has "$pid" "$CONF" && { echo "$pid"; return 0; }
	done
	return 0
}

# shim_pids: containerd shims started by this rig's containerd (argv has `-address SOCK`).
shim_pids() {
	local d pid prev arg is_shim hit
	for d in /proc/[0-9]*; do
		pid=${d#/proc/}
		[[ -r $d/cmdline ]] || continue
		prev= is_shim=0 hit=0
		while IFS= read -r -d '' arg; do
			[[ $arg == *containerd-shim* ]] && is_shim=1
			[[ $prev == -address && $arg == "$SOCK" ]] && hit=1
			prev=$arg
		done <"$d/cmdline" 2>/dev/null || true
		((is_shim && hit)) && echo "$pid"
	done
	return 0
}

# pids_in_netns INODE...: processes whose network namespace is one of the given inodes.
pids_in_netns() {
	local want=" $* " d pid link ino
	for d in /proc/[0-9]*; do
		pid=${d#/proc/}
		link=$(readlink "$d/ns/net" 2>/dev/null) || continue
		ino=${link#net:[}; ino=${ino%]}
		[[ $want == *" $ino "* ]] || continue
		# not us, our callers, or our own short-lived helpers (command substitutions)
		is_protected_pid "$pid" && continue
		[[ $(proc_stat_field "$pid" 2) == "$$" ]] && continue
		echo "$pid"
	done
	return 0
}

# mounts_under DIR: mount points at or below DIR, deepest first.
mounts_under() {
	local dir=$1
	awk -v d="$dir" '{ p = $2; gsub(/\\040/, " ", p); if (p == d || index(p, d "/") == 1) print p }' /proc/self/mounts \
		| awk '{ print length($0) "\t" $0 }' | sort -rn | cut -f2-
}

# ---------------------------------------------------------------------------------------------
# up

write_cni_conf() {
	mkdir -p "$CNI_CONF_DIR" "$IPAM_DIR"
	local p
	for p in bridge host-local portmap loopback; do
		[[ -x $CNI_BIN_DIR/$p ]] || die "CNI plugin $CNI_BIN_DIR/$p missing (run: rig.sh install)"
	done
	[[ $RIG_POD_CIDR =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+/[0-9]+$ ]] || die "RIG_POD_CIDR '$RIG_POD_CIDR' is not an IPv4 CIDR"
	# loopback is not in the chain: containerd's CRI sets up lo itself with $CNI_BIN_DIR/loopback.
	cat >"$CNI_CONF_DIR/10-rig.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "rig",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$RIG_POD_CIDR" }]],
        "routes": [{ "dst": "0.0.0.0/0" }],
        "dataDir": "$IPAM_DIR"
      }
    },
    {
      "type": "portmap",
      "capabilities": { "portMappings": true },
      "snat": true
    }
  ]
}
EOF
}

write_containerd_conf() {
	sed -e "s|@RIG_DIR@|$RIG_DIR|g" -e "s|@SOCK@|$SOCK|g" -e "s|@RUNC@|$RUNC_BIN|g" \
		-e "s|@CNI_BIN_DIR@|$CNI_BIN_DIR|g" -e "s|@SANDBOX_IMAGE@|$SANDBOX_IMAGE|g" \
		-e "s|@LOG_LEVEL@|$RIG_LOG_LEVEL|g" \
		"$RIG_SRC/containerd.toml.in" >"$CONF.tmp"
	! grep -q '@[A-Z_]*@' "$CONF.tmp" || die "unsubstituted placeholder in $CONF.tmp"
	mv -f "$CONF.tmp" "$CONF"
}

# mount_imagefs: with RIG_IMAGEFS_SIZE (e.g. 96m), containerd's root (content store, snapshots,
# metadata: what CRI ImageFsInfo reports) goes on a tmpfs of that size at $RIG_DIR/root, so
# tests can fill the image filesystem. `down` unmounts it with every other mount under the rig.
mount_imagefs() {
	local size=${RIG_IMAGEFS_SIZE:-}
	rm -f "$RIG_DIR/imagefs_size"
	[[ -n $size ]] || return 0
	[[ $size =~ ^[1-9][0-9]*[kKmMgG]?$ ]] \
		|| die "RIG_IMAGEFS_SIZE '$size' is not a tmpfs size (digits with an optional k, m or g)"
	mount -t tmpfs -o "size=$size,mode=0711" "rig-imagefs-$NAME" "$RIG_DIR/root" \
		|| die "cannot mount a tmpfs of $size on $RIG_DIR/root (RIG_IMAGEFS_SIZE)"
	echo "$size" >"$RIG_DIR/imagefs_size"
	log "up: containerd root on a $size tmpfs ($RIG_DIR/root)"
}

ctr_ok() { ctr -a "$SOCK" --connect-timeout 1s --timeout 3s version >/dev/null 2>&1; }

# start_containerd: containerd in the rig's netns ONLY (nsenter --net; not `ip netns exec`,
# which makes a new mount namespace and breaks runc's cgroup lookup).
start_containerd() {
	local pid i
	[[ -e $NETNS_PATH ]] || die "netns $NAME missing"
	rm -f "$SOCK" "$SOCK.ttrpc"
	mkdir -p "$LOGDIR"
	echo "=== $(date -u +%FT%TZ) rig: starting containerd" >>"$CD_LOG"
	# setsid: own session, so the caller's signals/terminal do not reach it. fds 8/9 (locks)
	# closed. nsenter with only --net execs containerd directly, so $! is containerd's PID.
	setsid nsenter --net="$NETNS_PATH" containerd --config "$CONF" \
		</dev/null >>"$CD_LOG" 2>&1 8>&- 9>&- &
	pid=$!
	echo "$pid" >"$PIDFILE"
	for ((i = 0; i < 200; i++)); do
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -n 20 "$CD_LOG" >&2 || true
			die "containerd (pid $pid) exited during start; log: $CD_LOG"
		fi
		if [[ -S $SOCK ]] && ctr_ok; then
			CONTAINERD_PID=$pid
			return 0
		fi
		sleep 0.1
	done
	tail -n 20 "$CD_LOG" >&2 || true
	die "containerd socket $SOCK did not answer within 20s; log: $CD_LOG"
}

import_images() {
	local t
	shopt -s nullglob
	local tars=("$RIG_IMAGES"/*.tar)
	shopt -u nullglob
	for t in "${tars[@]}"; do
		ctr -a "$SOCK" -n "$CTR_NS" images import --all-platforms "$t" >/dev/null \
			|| die "ctr images import $t failed"
	done
}

env_lines() {
	cat <<EOF
RIG_NAME=$NAME
RIG_NETNS=$NAME
RIG_NETNS_PATH=$NETNS_PATH
RIG_STATE=$RIG_DIR
CONTAINERD_SOCK=$SOCK
CRI_ENDPOINT=unix://$SOCK
CONTAINERD_PID=$CONTAINERD_PID
CONTAINERD_LOG=$CD_LOG
RIG_RUNC_ROOT=$RUNC_ROOT
RIG_CNI_CONF_DIR=$CNI_CONF_DIR
RIG_POD_CIDR=$RIG_POD_CIDR
RIG_CGROUP_ROOT=$CGROUP_ROOT
RIG_IMAGES=$RIG_IMAGES
RIG_SANDBOX_IMAGE=$SANDBOX_IMAGE
RIG_BUSYBOX_IMAGE=$BUSYBOX_IMAGE
RIG_CONTAINERD_ROOT=$RIG_DIR/root
EOF
	if [[ -f $RIG_DIR/imagefs_size ]]; then
		echo "RIG_IMAGEFS_SIZE=$(cat "$RIG_DIR/imagefs_size")"
	fi
}

write_env() {
	env_lines >"$ENVFILE.tmp"
	mv -f "$ENVFILE.tmp" "$ENVFILE"
	cat "$ENVFILE"
}

# netns_set KEY VALUE: write a sysctl under /proc/sys inside the rig's netns only.
netns_sysctl() {
	local key=$1 val=$2 path=/proc/sys/${1//.//}
	nsenter --net="$NETNS_PATH" sh -c 'test -e "$1" && echo "$2" > "$1"' sh "$path" "$val" \
		|| log "warning: could not set $key=$val inside netns $NAME"
}

up_failed() {
	local rc=$?
	trap - EXIT
	((rc != 0)) || return 0
	if [[ ${RIG_KEEP_ON_FAILURE:-0} == 1 ]]; then
		log "up failed (rc $rc); keeping $RIG_DIR for inspection (RIG_KEEP_ON_FAILURE=1)"
	else
		[[ -f $CD_LOG ]] && cp -f "$CD_LOG" "$RIG_HOME/$NAME.failed-containerd.log" 2>/dev/null || true
		log "up failed (rc $rc); tearing rig $NAME down (containerd log kept in $RIG_HOME/$NAME.failed-containerd.log)"
		(teardown) || true
	fi
	exit "$rc"
}

cmd_up() {
	need_root
	check_home
	check_name "${1:-}"
	set_paths "$1"
	local t0 t1
	t0=$(date +%s%N)
	for c in containerd ctr nsenter ip flock setsid findmnt; do
		command -v "$c" >/dev/null || die "$c not found (run: rig.sh install)"
	done
	lock_rig

	if [[ -e $NETNS_PATH ]] && ! mountpoint -q "$NETNS_PATH"; then
		# Not a live namespace: a leftover file from before a reboot (/run not on tmpfs).
		[[ -f $MARKER ]] && { log "up: removing stale $NETNS_PATH (not a mounted namespace)"; rm -f "$NETNS_PATH"; }
	fi
	if [[ -e $NETNS_PATH ]]; then
		if [[ -f $MARKER && $(cat "$RIG_DIR/boot_id" 2>/dev/null) == "$(boot_id)" ]]; then
			die "rig $NAME is already up (netns $NAME exists); run: rig.sh down $NAME"
		fi
		die "network namespace $NAME already exists and is not a rig of this boot; pick another name or remove it"
	fi
	if [[ -d $RIG_DIR ]]; then
		log "up: leftover state in $RIG_DIR: cleaning it first"
		teardown
	fi

	build_images "$RIG_IMAGES"

	# From here on a failure tears the half-built rig down again (RIG_KEEP_ON_FAILURE=1 keeps it).
	trap 'up_failed' EXIT
	mkdir -p "$RIG_DIR" "$RIG_DIR/root" "$RIG_DIR/state" "$RIG_DIR/tmp" "$RIG_DIR/opt" "$RUNC_ROOT" \
		"$RIG_DIR/certs.d" "$LOGDIR" "$CNI_CONF_DIR" "$IPAM_DIR"
	chmod 0711 "$RIG_DIR"
	boot_id >"$RIG_DIR/boot_id"
	echo "$NAME" >"$MARKER" # written BEFORE the netns exists: `down` only deletes netns it owns

	mount_imagefs

	ip netns add "$NAME"
	ip -n "$NAME" link set lo up
	netns_sysctl net.ipv4.ip_forward 1
	netns_sysctl net.ipv4.conf.all.forwarding 1
	# br_netfilter knobs are per-netns (kernel >= 5.3) when the module is loaded; never load it.
	netns_sysctl net.bridge.bridge-nf-call-iptables 1
	netns_sysctl net.bridge.bridge-nf-call-ip6tables 1

	write_containerd_conf
	write_cni_conf
	start_containerd
	import_images
	write_env
	trap - EXIT
	t1=$(date +%s%N)
	rm -f "$RIG_HOME/$NAME.failed-containerd.log"
	log "up: rig $NAME ready in $(((t1 - t0) / 1000000)) ms"
}

# ---------------------------------------------------------------------------------------------
# down

# teardown: kill everything of this rig, unmount, delete netns and state. Assumes set_paths.
teardown() {
	local same_boot=0 pid ino inodes=() m i
	[[ -f $RIG_DIR/boot_id && $(cat "$RIG_DIR/boot_id") == "$(boot_id)" ]] && same_boot=1

	((same_boot)) || log "down: $RIG_DIR is from another boot: wiping it without killing anything"
	if ((same_boot)); then
		# 1. containerd (by recorded PID, verified).
		pid=$(containerd_pid)
		if [[ -n $pid ]]; then
			log "down: stopping containerd pid $pid"
			stop_pid "$pid" 10
		fi
		# 2. containers known to runc (all containerd namespaces under our runc root).
		if command -v "$RUNC_BIN" >/dev/null && [[ -d $RUNC_ROOT ]]; then
			local root id
			for root in "$RUNC_ROOT"/*/; do
				[[ -d $root ]] || continue
				while read -r id; do
					[[ -n $id ]] || continue
					"$RUNC_BIN" --root "$root" delete --force "$id" >/dev/null 2>&1 \
						|| log "down: runc delete $id failed"
				done < <("$RUNC_BIN" --root "$root" list -q 2>/dev/null || true)
			done
		fi
		#    Containers started with `ctr run` WITHOUT --runc-root keep their runc state in the
		#    shared default root /run/containerd/runc/<ns>; ours are those whose rootfs is under
		#    our state dir.
		local st
		for st in /run/containerd/runc/*/*/state.json; do
			[[ -f $st ]] && grep -qF "\"$RIG_DIR/" "$st" 2>/dev/null || continue
			id=$(basename "$(dirname "$st")")
			"$RUNC_BIN" --root "$(dirname "$(dirname "$st")")" delete --force "$id" >/dev/null 2>&1 \
				|| log "down: runc delete $id (default runc root) failed"
		done
		# 3. shims of this containerd (argv: -address SOCK), and their sockets.
		local shims
		shims=$(shim_pids)
		if [[ -n $shims ]]; then
			log "down: killing shims $(echo $shims)"
			for pid in $shims; do
				local ns='' sid='' prev='' arg
				while IFS= read -r -d '' arg; do
					[[ $prev == -namespace ]] && ns=$arg
					[[ $prev == -id ]] && sid=$arg
					prev=$arg
				done </proc/"$pid"/cmdline 2>/dev/null || true
				is_protected_pid "$pid" || kill -KILL "$pid" 2>/dev/null || true
				if [[ -n $ns && -n $sid ]]; then
					# containerd 1.6: /run/containerd/s/sha256(<address>/<namespace>/<id>)
					local h
					h=$(printf '%s' "$SOCK/$ns/$sid" | sha256sum | cut -d' ' -f1)
					rm -f "/run/containerd/s/$h"
				fi
			done
		fi
		# 4. anything still living in the rig's netns or in a pod netns mounted under the state
		#    dir (hostNetwork containers, pods whose runc state was lost, ...).
		local own
		# Never the host's netns, whatever the files say: PID 1's, or (if that is unreadable,
		# as in some sandboxes) the one of our oldest ancestor whose namespace we can read.
		own=$(host_netns_inode)
		if [[ -e $NETNS_PATH && -f $MARKER ]]; then
			ino=$(stat -L -c %i "$NETNS_PATH" 2>/dev/null || true)
			[[ -n $ino && $ino != "$own" ]] && inodes+=("$ino")
		fi
		while read -r m; do
			[[ -n $m ]] || continue
			ino=$(stat -L -c %i "$m" 2>/dev/null || true)
			[[ -n $ino && $ino != "$own" ]] && inodes+=("$ino")
		done < <(awk -v d="$RIG_DIR/" '$3 == "nsfs" && index($2, d) == 1 { print $2 }' /proc/self/mounts)
		if ((${#inodes[@]})); then
			for i in 1 2 3 4 5; do
				local stray
				stray=$(pids_in_netns "${inodes[@]}")
				[[ -n $stray ]] || break
				log "down: killing processes left in the rig's network namespaces: $(echo $stray)"
				for pid in $stray; do is_protected_pid "$pid" || kill -KILL "$pid" 2>/dev/null || true; done
				sleep 0.2
			done
		fi
		# 5. cgroups under the rig's cgroup root (kubelet --cgroup-root=$CGROUP_ROOT): thaw,
		#    kill the members, remove the directories bottom-up. Every hierarchy (v1 and v2).
		local mnt cg f
		while read -r mnt; do
			cg=$mnt$CGROUP_ROOT
			[[ -d $cg ]] || continue
			for f in $(find "$cg" -name freezer.state 2>/dev/null); do echo THAWED >"$f" 2>/dev/null || true; done
			for i in 1 2 3 4 5; do
				local members
				members=$(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
				[[ -n $members ]] || break
				log "down: killing processes in cgroup $cg: $(echo $members)"
				for pid in $members; do is_protected_pid "$pid" || kill -KILL "$pid" 2>/dev/null || true; done
				sleep 0.2
			done
			find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
		done < <(awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/self/mounts)
	fi

	# 6. mounts under the rig dir (overlay rootfs, shm, netns bind mounts), deepest first, lazily.
	for i in 1 2 3 4 5; do
		local ms
		ms=$(mounts_under "$RIG_DIR")
		[[ -n $ms ]] || break
		while read -r m; do
			[[ -n $m ]] && { umount -l "$m" 2>/dev/null || log "down: umount $m failed"; }
		done <<<"$ms"
	done
	[[ -z $(mounts_under "$RIG_DIR") ]] || die "mounts left under $RIG_DIR: $(mounts_under "$RIG_DIR" | tr '\n' ' ')"

	# 7. the netns (only one this rig created: the marker is written before `ip netns add`).
	if [[ -f $MARKER && -e $NETNS_PATH ]] && { ((same_boot)) || ! mountpoint -q "$NETNS_PATH"; }; then
		ip netns del "$NAME" 2>/dev/null || { umount -l "$NETNS_PATH" 2>/dev/null || true; rm -f "$NETNS_PATH"; }
	fi

	# 8. libcni's result cache (/var/lib/cni/results) entries of our pods name our state dir.
	if [[ -d /var/lib/cni/results ]]; then
		grep -lF -- "$RIG_DIR/" /var/lib/cni/results/* 2>/dev/null | while read -r f; do rm -f "$f"; done || true
	fi

	# 9. state (never crossing into another file system).
	if [[ -d $RIG_DIR ]]; then
		rm -rf --one-file-system "$RIG_DIR"
	fi
}

cmd_down() {
	need_root
	check_home
	check_name "${1:-}"
	set_paths "$1"
	if [[ ! -d $RIG_DIR ]]; then
		log "down: rig $NAME not found under $RIG_HOME (nothing to do)"
		return 0
	fi
	[[ -f $MARKER || -f $CONF ]] || die "$RIG_DIR does not look like a rig directory; refusing to touch it"
	lock_rig
	teardown
	log "down: rig $NAME removed"
}

cmd_down_all() {
	need_root
	check_home
	local d n rc=0
	[[ -d $RIG_HOME ]] || return 0
	for d in "$RIG_HOME"/*/; do
		n=$(basename "$d")
		[[ -f $d/.node-rig ]] || continue
		[[ $n =~ ^[a-z0-9][a-z0-9-]{0,30}$ ]] || continue
		(cmd_down "$n") || rc=1
	done
	return $rc
}

# ---------------------------------------------------------------------------------------------
# status, restart, env, list

cmd_status() {
	check_home
	check_name "${1:-}"
	set_paths "$1"
	[[ -d $RIG_DIR ]] || { echo "$NAME: not up"; return 1; }
	local pid
	pid=$(containerd_pid)
	if [[ -e $NETNS_PATH ]]; then echo "$NAME: netns $NAME present"; else echo "$NAME: netns $NAME MISSING"; fi
	if [[ -n $pid ]]; then echo "$NAME: containerd pid $pid running"; else echo "$NAME: containerd not running"; fi
	local v
	if v=$(ctr -a "$SOCK" --connect-timeout 2s --timeout 5s version 2>&1); then
		echo "$NAME: containerd answers on $SOCK ($(echo "$v" | awk '/Server:/{s=1} s && /Version:/{print $2; exit}'))"
		return 0
	fi
	echo "$NAME: containerd does NOT answer on $SOCK"
	return 1
}

cmd_restart() {
	need_root
	check_home
	check_name "${1:-}"
	set_paths "$1"
	local mode=${2:-}
	[[ -f $MARKER && -f $CONF ]] || die "rig $NAME is not up"
	[[ $(cat "$RIG_DIR/boot_id" 2>/dev/null) == "$(boot_id)" ]] || die "rig $NAME is from another boot; run down/up"
	[[ -e $NETNS_PATH ]] || die "netns $NAME missing; run down/up"
	lock_rig
	local pid
	pid=$(containerd_pid)
	if [[ -n $pid ]]; then
		if [[ $mode == --kill ]]; then
			log "restart: SIGKILL containerd pid $pid (shims and containers keep running)"
			kill -KILL "$pid" 2>/dev/null || true
			while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
		else
			log "restart: stopping containerd pid $pid (shims and containers keep running)"
			stop_pid "$pid" 10
		fi
	fi
	start_containerd
	write_env
	log "restart: containerd pid $CONTAINERD_PID answers"
}

cmd_env() {
	check_home
	check_name "${1:-}"
	set_paths "$1"
	[[ -f $ENVFILE ]] || die "rig $NAME is not up"
	cat "$ENVFILE"
}

cmd_list() {
	check_home
	local d
	for d in "$RIG_HOME"/*/; do
		[[ -f $d/.node-rig ]] && basename "$d"
	done
	return 0
}

main() {
	local cmd=${1:-}
	shift || true
	case $cmd in
	install) cmd_install "$@" ;;
	images) cmd_images "$@" ;;
	up) cmd_up "$@" ;;
	down) cmd_down "$@" ;;
	down-all) cmd_down_all "$@" ;;
	status) cmd_status "$@" ;;
	restart-containerd) cmd_restart "$@" ;;
	env) cmd_env "$@" ;;
	list) cmd_list "$@" ;;
	-h | --help | help) usage ;;
	*) usage ;;
	esac
}

main "$@"
