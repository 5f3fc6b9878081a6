#!/usr/bin/env bash
# Soak bench: the kubelet (standalone, static pods) and kube-proxy (static Services) on a node
# rig for SOAK_SECONDS (default 3600) under churn: a pod created and another deleted every few
# seconds, a pod whose readiness probe flaps, Services and EndpointSlices rewritten every few
# seconds. Every SOAK_SAMPLE seconds (default 60) it samples each process's RSS and open fds
# and prints them; at the end, the growth after the first SOAK_WARMUP seconds (default 600)
# as a slope per hour. Prints figures; asserts nothing (a bench, not a test).
#
#   tests/soak.sh                      # one hour
#   SOAK_SECONDS=300 SOAK_SAMPLE=10 SOAK_WARMUP=60 tests/soak.sh   # a short run
#
# Root; touches only the rig's namespace and its own temp dir. Release binaries when built
# (cargo build --release --bins), else debug ones.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rig="$root/tests/rig/rig.sh"
name=soak
duration=${SOAK_SECONDS:-3600}
sample=${SOAK_SAMPLE:-60}
warmup=${SOAK_WARMUP:-600}
[[ $(id -u) == 0 ]] || { echo "soak: run as root" >&2; exit 1; }

bin_dir="$root/target/release"
[[ -x $bin_dir/kubelet && -x $bin_dir/kube-proxy ]] || bin_dir="$root/target/debug"
[[ -x $bin_dir/kubelet && -x $bin_dir/kube-proxy ]] || {
	echo "soak: build first: cargo build --release --bins" >&2
	exit 1
}
"$rig" images >/dev/null
"$rig" down "$name" >/dev/null 2>&1 || true
eval "$("$rig" up "$name")"
work=$(mktemp -d /tmp/soak.XXXXXX)
mkdir -p "$work/manifests" "$work/services" "$work/bin"
# Copies: a rebuild during the run must not touch the running binaries.
cp "$bin_dir/kubelet" "$bin_dir/kube-proxy" "$work/bin/"
echo "soak: binaries from $bin_dir"
bin_dir="$work/bin"
cat >"$work/config.yaml" <<CFG
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: $work/manifests
podLogsDir: $work/logs
cgroupRoot: $RIG_CGROUP_ROOT
fileCheckFrequency: 20s
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
CFG

pod() { # name, extra container fields (YAML, indented 4)
	cat <<POD
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
$2
POD
}
for i in $(seq 1 10); do
	pod "steady-$i" '    command: ["sh", "-c", "trap '"'"'exit 0'"'"' TERM; sleep 36000 & wait"]' \
		>"$work/manifests/steady-$i.yaml"
done
# Readiness flaps every 5 s (the container toggles the file the probe checks).
pod flappy '    command: ["sh", "-c", "trap '"'"'exit 0'"'"' TERM; while true; do touch /tmp/ready; sleep 5; rm -f /tmp/ready; sleep 5; done & wait"]
    readinessProbe: {exec: {command: ["test", "-f", "/tmp/ready"]}, periodSeconds: 1}
    livenessProbe: {tcpSocket: {port: 1}, initialDelaySeconds: 36000}' >"$work/manifests/flappy.yaml"

nsenter --net="$RIG_NETNS_PATH" "$bin_dir/kubelet" --config="$work/config.yaml" \
	--container-runtime-endpoint="$CRI_ENDPOINT" --root-dir="$work/root" \
	--hostname-override=soak-node >"$work/kubelet.log" 2>&1 &
kubelet=$!
nsenter --net="$RIG_NETNS_PATH" "$bin_dir/kube-proxy" --static-services-dir="$work/services" \
	--hostname-override=soak-node --healthz-bind-address=127.0.0.1:10256 \
	--metrics-bind-address=127.0.0.1:10249 >"$work/kube-proxy.log" 2>&1 &
proxy=$!
churn=""
cleanup() {
	set +e
	[[ -n $churn ]] && kill "$churn" 2>/dev/null
	rm -f "$work"/manifests/*.yaml
	sleep 5
	kill "$kubelet" "$proxy" 2>/dev/null || true
	wait "$kubelet" "$proxy" 2>/dev/null || true
	"$rig" down "$name" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

services() { # k: a generation number; 20 Services, 5 of them changing each time
	for s in $(seq 1 20); do
		local eps=$(((s + $1) % 4 + 1))
		cat <<SVC
---
apiVersion: v1
kind: Service
metadata: {name: svc-$s, namespace: default}
spec:
  clusterIP: 10.96.1.$s
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-$s-a
  namespace: default
  labels: {kubernetes.io/service-name: svc-$s}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
SVC
		for e in $(seq 1 "$eps"); do
			echo "- {addresses: [10.88.$s.$e], conditions: {ready: true}}"
		done
	done
}

# Churn: every 3 s a pod appears or goes, and the Services are rewritten (bounded count).
(
	end=$((SECONDS + duration))
	k=0
	while ((SECONDS < end && k < 100000)); do
		k=$((k + 1))
		f="$work/manifests/churn-$((k % 4)).yaml"
		if [[ -f $f ]]; then rm -f "$f"; else
			# Written beside, then renamed in: the agent never sees half a file.
			pod "churn-$((k % 4))" '    command: ["sleep", "36000"]' >"$work/churn.tmp" && mv "$work/churn.tmp" "$f"
		fi
		services "$k" >"$work/services.tmp" && mv "$work/services.tmp" "$work/services/s.yaml"
		sleep 3
	done
) &
churn=$!

rss() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
fds() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
echo "soak: ${duration}s, sample every ${sample}s"
printf '%8s %12s %8s %12s %8s\n' "t(s)" "kubelet KiB" "fds" "proxy KiB" "fds"
samples="$work/samples"
start=$SECONDS
while ((SECONDS - start < duration)); do
	sleep "$sample"
	kill -0 "$kubelet" 2>/dev/null || { echo "soak: kubelet exited"; tail -20 "$work/kubelet.log"; exit 1; }
	kill -0 "$proxy" 2>/dev/null || { echo "soak: kube-proxy exited"; tail -20 "$work/kube-proxy.log"; exit 1; }
	t=$((SECONDS - start))
	line="$t $(rss "$kubelet") $(fds "$kubelet") $(rss "$proxy") $(fds "$proxy")"
	echo "$line" >>"$samples"
	printf '%8s %12s %8s %12s %8s\n' $line
done

# Least-squares slope after the warm-up, per hour, for each column.
awk -v warm="$warmup" '
	$1 >= warm { n++; x += $1; for (c = 2; c <= 5; c++) { y[c] += $c; xy[c] += $1 * $c }; xx += $1 * $1 }
	END {
		if (n < 2) { print "soak: not enough samples after the warm-up for a trend"; exit }
		split("kubelet_rss_KiB kubelet_fds proxy_rss_KiB proxy_fds", name, " ")
		for (c = 2; c <= 5; c++) {
			slope = (n * xy[c] - x * y[c]) / (n * xx - x * x) * 3600
			printf "soak: %s after %ds: mean %.0f, trend %+.1f per hour (%d samples)\n", name[c - 1], warm, y[c] / n, slope, n
		}
	}' "$samples"
errors=$(grep -c ' ERROR ' "$work/kubelet.log" || true)
perrors=$(grep -c ' ERROR ' "$work/kube-proxy.log" || true)
echo "soak: ERROR lines: kubelet $errors, kube-proxy $perrors"
# What they said (timestamps and spans cut), most frequent first.
for f in kubelet kube-proxy; do
	grep ' ERROR ' "$work/$f.log" | sed -E 's/^[^ ]+ +ERROR +//' | cut -c1-200 | sort | uniq -c |
		sort -rn | head -5 | sed "s/^/soak: $f: /"
done
