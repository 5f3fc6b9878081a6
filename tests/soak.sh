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
# To tell a leak from allocator noise, each sample also records the kubelet's anonymous
# memory (RssAnon), its threads, and, every SOAK_MALLOC_EVERY samples (default 5; 0 = never),
# glibc's own count of the bytes the heap hands out ("in use") against what it holds from the
# kernel ("system"), read with gdb calling malloc_stats() in the process (a pause of well under
# a second; skipped without gdb). A leak grows "in use"; fragmentation grows only "system".
# SOAK_NAME names the rig (default soak), so that two soaks can run side by side.
# SOAK_OUT=DIR keeps the samples, the malloc statistics and both logs after the run.
# SOAK_KUBELET_WRAP="heaptrack -o FILE" runs the kubelet under a wrapper (the samples follow
# the kubelet itself; it gets SIGTERM first at the end, so the wrapper can write its data).
#
# Root; touches only the rig's namespace and its own temp dir. Release binaries when built
# (cargo build --release --bins), else debug ones.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rig="$root/tests/rig/rig.sh"
name=${SOAK_NAME:-soak}
duration=${SOAK_SECONDS:-3600}
sample=${SOAK_SAMPLE:-60}
warmup=${SOAK_WARMUP:-600}
malloc_every=${SOAK_MALLOC_EVERY:-5}
out=${SOAK_OUT:-}
read -r -a wrap <<<"${SOAK_KUBELET_WRAP:-}"
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

nsenter --net="$RIG_NETNS_PATH" "${wrap[@]}" "$bin_dir/kubelet" --config="$work/config.yaml" \
	--container-runtime-endpoint="$CRI_ENDPOINT" --root-dir="$work/root" \
	--hostname-override=soak-node >"$work/kubelet.log" 2>&1 &
kubelet=$!
launcher=$kubelet
if ((${#wrap[@]})); then
	# The kubelet is a descendant of the wrapper: follow it, not the wrapper.
	for _ in $(seq 1 50); do
		k=$(for c in "$launcher" $(pgrep -P "$launcher"); do echo "$c"; pgrep -P "$c"; done |
			while read -r c; do [[ $(readlink "/proc/$c/exe") == "$bin_dir/kubelet" ]] && echo "$c"; done | head -1) || true
		[[ -n $k ]] && break
		sleep 0.2
	done
	if [[ -z $k ]]; then
		echo "soak: no kubelet under ${wrap[*]}" >&2
		kill "$launcher" 2>/dev/null
		"$rig" down "$name" >/dev/null 2>&1
		rm -rf "$work"
		exit 1
	fi
	kubelet=$k
fi
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
	wait "$launcher" "$proxy" 2>/dev/null || true
	"$rig" down "$name" >/dev/null 2>&1 || true
	if [[ -n $out ]]; then
		mkdir -p "$out"
		cp -a "$work/samples" "$work/malloc" "$work/kubelet.log" "$work/kube-proxy.log" "$out/" 2>/dev/null
	fi
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
status() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
# glibc's malloc_stats() of process $1 into file $2 (its stderr pointed there for the call).
malloc_stats() {
	gdb -p "$1" -batch -nx -q \
		-ex 'set $fd = (int) open("'"$2"'", 577, 420)' -ex 'set $saved = (int) dup(2)' \
		-ex 'call (int) dup2($fd, 2)' -ex 'call (void) malloc_stats()' \
		-ex 'call (int) dup2($saved, 2)' -ex 'call (int) close($saved)' \
		-ex 'call (int) close($fd)' >/dev/null 2>&1 </dev/null || true
}
# "in use" and "system" bytes of the "Total" block, in KiB.
malloc_totals() {
	awk '/^Total/ {t = 1} t && /system bytes/ {s = $NF} t && /in use bytes/ {u = $NF}
		END {if (s != "") printf "%d %d", u / 1024, s / 1024; else printf "- -"}' "$1" 2>/dev/null
}
have_gdb=""
command -v gdb >/dev/null && ((malloc_every > 0)) && have_gdb=1 && mkdir -p "$work/malloc"
echo "soak: ${duration}s, sample every ${sample}s${have_gdb:+, malloc_stats every $((sample * malloc_every))s}"
printf '%8s %12s %8s %12s %8s %12s %8s %12s %12s\n' "t(s)" "kubelet KiB" "fds" "proxy KiB" "fds" \
	"kubelet anon" "threads" "heap in use" "heap system"
samples="$work/samples"
n_sample=0
start=$SECONDS
while ((SECONDS - start < duration)); do
	sleep "$sample"
	kill -0 "$kubelet" 2>/dev/null || { echo "soak: kubelet exited"; tail -20 "$work/kubelet.log"; exit 1; }
	kill -0 "$proxy" 2>/dev/null || { echo "soak: kube-proxy exited"; tail -20 "$work/kube-proxy.log"; exit 1; }
	t=$((SECONDS - start))
	n_sample=$((n_sample + 1))
	heap="- -"
	if [[ -n $have_gdb ]] && ((n_sample % malloc_every == 0)); then
		malloc_stats "$kubelet" "$work/malloc/$t.txt"
		heap=$(malloc_totals "$work/malloc/$t.txt")
	fi
	line="$t $(rss "$kubelet") $(fds "$kubelet") $(rss "$proxy") $(fds "$proxy")"
	line="$line $(status "$kubelet" RssAnon) $(status "$kubelet" Threads) $heap"
	echo "$line" >>"$samples"
	printf '%8s %12s %8s %12s %8s %12s %8s %12s %12s\n' $line
done

# Least-squares slope after the warm-up, per hour, for each column.
# Columns with "-" (no malloc statistics in that sample) are left out of their own column's fit.
# The residual standard deviation says how far single samples stray from the line.
awk -v warm="$warmup" '
	$1 >= warm {
		for (c = 2; c <= 9; c++) if ($c != "-") {
			n[c]++; x[c] += $1; xx[c] += $1 * $1; y[c] += $c; xy[c] += $1 * $c
			sx[c, n[c]] = $1; sy[c, n[c]] = $c
		}
	}
	END {
		split("kubelet_rss_KiB kubelet_fds proxy_rss_KiB proxy_fds kubelet_anon_KiB kubelet_threads kubelet_heap_in_use_KiB kubelet_heap_system_KiB", name, " ")
		for (c = 2; c <= 9; c++) {
			if (n[c] < 3) { printf "soak: %s: not enough samples after the warm-up for a trend\n", name[c - 1]; continue }
			d = n[c] * xx[c] - x[c] * x[c]
			b = (n[c] * xy[c] - x[c] * y[c]) / d
			a = (y[c] - b * x[c]) / n[c]
			ss = 0
			for (i = 1; i <= n[c]; i++) { r = sy[c, i] - a - b * sx[c, i]; ss += r * r }
			sd = sqrt(ss / (n[c] - 2))
			# Standard error of the slope, per hour.
			se = sd / sqrt(xx[c] - x[c] * x[c] / n[c]) * 3600
			printf "soak: %s after %ds: mean %.0f, trend %+.1f ± %.1f per hour, residual sd %.1f (%d samples)\n", name[c - 1], warm, y[c] / n[c], b * 3600, se, sd, n[c]
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
