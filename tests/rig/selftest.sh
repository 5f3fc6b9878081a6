#!/usr/bin/env bash
# selftest.sh: the rig's own end-to-end check (what CI runs before the Rust e2e tests).
#
#   selftest.sh [NAME] [ROUNDS]      defaults: rigself 2
#
# Per round: up -> images listed -> `ctr run` -> CRI pod via cri-smoke.sh (bridge, portmap,
# cgroup parent) -> restart-containerd (TERM, then --kill) with the pod surviving -> a second
# rig in parallel -> down / down-all -> assert nothing is left (netns, processes, mounts,
# cgroups, root-netns iptables rules).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAME=${1:-rigself}
ROUNDS=${2:-2}
RIG=$HERE/rig.sh
RIG_HOME=${RIG_HOME:-/var/tmp/node-rig}
export RIG_HOME

say() { echo "selftest: $*" >&2; }
fail() { echo "selftest: FAIL: $*" >&2; exit 1; }
ms() { echo $(($(date +%s%N) / 1000000)); }

cni_rules_root() { iptables-save 2>/dev/null | grep -c CNI || true; }

assert_gone() {
	local n=$1 sock=$RIG_HOME/$1/containerd.sock d arg found=
	ip netns list | awk '{print $1}' | grep -qx "$n" && fail "netns $n still exists"
	grep -q " $RIG_HOME/$n[/ ]" /proc/self/mounts && fail "mounts left under $RIG_HOME/$n"
	[[ -e $RIG_HOME/$n ]] && fail "$RIG_HOME/$n still exists"
	for d in /proc/[0-9]*; do
		while IFS= read -r -d '' arg; do
			[[ $arg == "$sock" || $arg == "$RIG_HOME/$n/containerd.toml" ]] && found+=" ${d#/proc/}"
		done <"$d/cmdline" 2>/dev/null || true
	done
	[[ -z $found ]] || fail "processes of rig $n left:$found"
	compgen -G "/sys/fs/cgroup/*/rig-$n" >/dev/null && fail "cgroups /sys/fs/cgroup/*/rig-$n left"
	compgen -G "/sys/fs/cgroup/rig-$n" >/dev/null && fail "cgroup /sys/fs/cgroup/rig-$n left"
	return 0
}

base_rules=$(cni_rules_root)
"$RIG" install
"$RIG" images >/dev/null

for ((round = 1; round <= ROUNDS; round++)); do
	say "=== round $round"
	t0=$(ms)
	envs=$("$RIG" up "$NAME")
	t1=$(ms)
	say "up $NAME: $((t1 - t0)) ms"
	eval "$envs"
	[[ -S $CONTAINERD_SOCK ]] || fail "no socket"
	imgs=$(ctr -a "$CONTAINERD_SOCK" -n k8s.io images ls -q)
	grep -qx "$RIG_SANDBOX_IMAGE" <<<"$imgs" || fail "$RIG_SANDBOX_IMAGE not imported"
	grep -qx "$RIG_BUSYBOX_IMAGE" <<<"$imgs" || fail "$RIG_BUSYBOX_IMAGE not imported"
	out=$(ctr -a "$CONTAINERD_SOCK" -n k8s.io run --rm --runc-root "$RIG_RUNC_ROOT" \
		--cgroup "$RIG_CGROUP_ROOT/ctr-t1" "$RIG_BUSYBOX_IMAGE" t1 /bin/busybox echo hi)
	[[ $out == hi ]] || fail "ctr run printed '$out'"
	say "ctr run: ok"
	"$HERE/cri-smoke.sh" "$NAME" run
	"$RIG" restart-containerd "$NAME" >/dev/null
	"$HERE/cri-smoke.sh" "$NAME" check
	"$RIG" restart-containerd "$NAME" --kill >/dev/null
	"$RIG" status "$NAME" >/dev/null || fail "status after restart --kill"
	"$HERE/cri-smoke.sh" "$NAME" check
	# a second rig alongside (same pod CIDR: they never meet, each has its own netns)
	"$RIG" up "$NAME-b" >/dev/null
	"$HERE/cri-smoke.sh" "$NAME-b" run >/dev/null
	[[ $(cni_rules_root) == "$base_rules" ]] || fail "CNI rules appeared in the root netns"
	if [[ $round == 1 ]]; then
		"$HERE/cri-smoke.sh" "$NAME" clean
		"$RIG" down "$NAME"
		"$RIG" down "$NAME" # idempotent
		"$RIG" down "$NAME-b"
	else
		# leave the pods running: down-all must clean up everything anyway
		"$RIG" down-all
	fi
	assert_gone "$NAME"
	assert_gone "$NAME-b"
	[[ $(cni_rules_root) == "$base_rules" ]] || fail "CNI rules left in the root netns"
	say "round $round: clean"
done
say "OK ($ROUNDS rounds)"
