#!/usr/bin/env bash
# The main job: our kubelet, standalone, on a private containerd with the example pod.
# Builds what it needs, starts a node rig (containerd in its own network namespace), runs the
# agent there with tests/demo/web.yaml as a static pod, prints the pod's status from
# :10250/pods, fetches the pod's HTTP answer through its pod IP, then tears everything down
# (DEMO_KEEP=1 leaves the agent and rig running; stop them later with `tests/rig/rig.sh down demo`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rig="$root/tests/rig/rig.sh"
name=demo
[[ $(id -u) == 0 ]] || { echo "demo: run as root (network namespaces, containerd)" >&2; exit 1; }

"$rig" install
"$rig" images
echo "demo: building the agent"
(cd "$root" && cargo build --quiet --bin kubelet --bin cri)
kubelet_bin="$root/target/debug/kubelet"

"$rig" down "$name" >/dev/null 2>&1 || true
eval "$("$rig" up "$name")"
work=$(mktemp -d /tmp/kubelet-demo.XXXXXX)
mkdir -p "$work/manifests"
cp "$root/tests/demo/web.yaml" "$work/manifests/"
cat >"$work/config.yaml" <<CFG
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: $work/manifests
podLogsDir: $work/logs
cgroupRoot: $RIG_CGROUP_ROOT
# Standalone (no kubeconfig): upstream's v1beta1 defaults (webhook authn/authz) need an
# apiserver, so a standalone node serves :10250 to anonymous clients, as upstream users set it.
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
CFG

nsenter --net="$RIG_NETNS_PATH" "$kubelet_bin" --config="$work/config.yaml" \
	--container-runtime-endpoint="$CRI_ENDPOINT" --root-dir="$work/root" \
	--hostname-override=demo-node >"$work/kubelet.log" 2>&1 &
agent=$!
# Mounts at or below $1, deepest first (/proc/self/mounts escapes a space as \040).
mounts_below() {
	awk -v d="$1" '{ p = $2; gsub(/\\040/, " ", p); if (p == d || index(p, d "/") == 1) print length(p) "\t" p }' \
		/proc/self/mounts | sort -rn | cut -f2-
}
# The agent makes its root directory a shared bind mount of itself at start and, as upstream's
# kubelet does with /var/lib/kubelet, leaves it there when it stops; pods' volumes add their
# own mounts below it. They are the demo's to remove before its directory goes.
unmount_below() {
	local m
	for _ in 1 2 3; do
		while read -r m; do
			[[ -n $m ]] && { umount -l "$m" || true; }
		done < <(mounts_below "$1")
		[[ -z $(mounts_below "$1") ]] && return 0
	done
	echo "demo: mounts left under $1: $(mounts_below "$1" | tr '\n' ' ')" >&2
	return 1
}
cleanup() {
	local rc=$?
	set +e
	if [[ ${DEMO_KEEP:-0} == 1 ]]; then
		echo "demo: left running: agent PID $agent, rig '$name' (log $work/kubelet.log)"
		echo "demo: afterwards unmount what is left under $work before removing it"
		return
	fi
	kill "$agent" 2>/dev/null || true
	wait "$agent" 2>/dev/null || true
	"$rig" down "$name" >/dev/null 2>&1 || { echo "demo: tearing the rig down failed" >&2; rc=1; }
	if unmount_below "$work"; then
		rm -rf "$work" || rc=1
	else
		rc=1
	fi
	exit "$rc"
}
trap cleanup EXIT

in_ns() { nsenter --net="$RIG_NETNS_PATH" "$@"; }
pods_json() { in_ns curl -sk --max-time 5 https://127.0.0.1:10250/pods; }

echo "demo: waiting for the pod to be Running and Ready"
ip=""
for _ in $(seq 1 120); do
	body=$(pods_json || true)
	if grep -q '"phase":"Running"' <<<"$body" && grep -q '"type":"Ready","status":"True"\|"status":"True","type":"Ready"' <<<"$body"; then
		ip=$(grep -o '"podIP":"[^"]*"' <<<"$body" | head -n1 | cut -d'"' -f4)
		[[ -n $ip ]] && break
	fi
	sleep 0.5
done
if [[ -z $ip ]]; then
	echo "demo: the pod did not become ready; agent log:" >&2
	tail -n 40 "$work/kubelet.log" >&2
	exit 1
fi

echo
echo "== GET https://127.0.0.1:10250/pods (inside the node's network namespace) =="
if command -v python3 >/dev/null 2>&1; then pods_json | python3 -m json.tool; else pods_json; echo; fi
echo
echo "== the runtime's view (cri ps) =="
"$root/target/debug/cri" --endpoint "$CRI_ENDPOINT" ps
echo
echo "== GET http://$ip:8080/index.html (the pod, through its pod IP) =="
in_ns curl -s --max-time 5 "http://$ip:8080/index.html"
echo
echo "demo: healthz says: $(in_ns curl -s --max-time 5 http://127.0.0.1:10248/healthz)"
