#!/usr/bin/env bash
# cri-smoke.sh: prove a rig's containerd serves CRI end to end, with no CRI client installed:
# gRPC over the unix socket with `curl --http2-prior-knowledge`, protobuf encoded by hand.
#
#   cri-smoke.sh NAME [run|check|clean]
#     run    (default) RunPodSandbox (bridge CNI, hostPort 8080->80, cgroup parent
#            $RIG_CGROUP_ROOT/pod-smoke), CreateContainer+StartContainer busybox httpd,
#            ExecSync, HTTP to the pod IP and to the hostPort from inside the rig netns.
#            Leaves the pod running (ids in $RIG_STATE/smoke.ids) so restart/down can be tested.
#    check   ExecSync into the recorded container again (e.g. after restart-containerd)
#    clean   StopPodSandbox + RemovePodSandbox of the recorded pod
#
# Needs curl built with HTTP/2 (nghttp2), od, and a rig that is up (rig.sh up NAME).
set -euo pipefail

NAME=${1:?usage: cri-smoke.sh NAME [run|check|clean]}
MODE=${2:-run}
RIG_HOME=${RIG_HOME:-/var/tmp/node-rig}
ENVFILE=$RIG_HOME/$NAME/env
[[ -f $ENVFILE ]] || { echo "cri-smoke: rig $NAME is not up" >&2; exit 1; }
# shellcheck disable=SC1090
. "$ENVFILE"
IDS=$RIG_STATE/smoke.ids
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cri-smoke.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

say() { echo "cri-smoke: $*" >&2; }
fail() { echo "cri-smoke: FAIL: $*" >&2; exit 1; }

# --- protobuf (hex strings) -------------------------------------------------------------
hvarint() {
	local n=$1 out=
	while ((n >= 128)); do out+=$(printf '%02x' $(((n & 127) | 128))); n=$((n >> 7)); done
	printf '%s%02x' "$out" "$n"
}
hstr() { printf '%s' "$1" | od -An -v -tx1 | tr -d ' \n'; }
fbytes() { printf '%s%s%s' "$(hvarint $((($1 << 3) | 2)))" "$(hvarint $((${#2} / 2)))" "$2"; } # N hex
fstr() { fbytes "$1" "$(hstr "$2")"; }
fvar() { printf '%s%s' "$(hvarint $(($1 << 3)))" "$(hvarint "$2")"; }
fmap() { fbytes "$1" "$(fstr 1 "$2")$(fstr 2 "$3")"; } # map<string,string> entry
hex2bin() { printf '%b' "$(sed 's/../\\x&/g')"; }

# pbget HEX N: payload (hex) of the first length-delimited field N, or the value of varint N.
pbget() {
	local h=$1 want=$2 i=0 tag f wt len v shift
	while ((i < ${#h})); do
		read -r tag i < <(rdvarint "$h" "$i")
		f=$((tag >> 3)) wt=$((tag & 7))
		case $wt in
		0) read -r v i < <(rdvarint "$h" "$i"); ((f == want)) && { echo "$v"; return 0; } ;;
		1) i=$((i + 16)) ;;
		2) read -r len i < <(rdvarint "$h" "$i")
		   ((f == want)) && { echo "${h:i:len*2}"; return 0; }
		   i=$((i + len * 2)) ;;
		5) i=$((i + 8)) ;;
		*) return 1 ;;
		esac
	done
	return 1
}
rdvarint() { # HEX POS -> "value newpos"
	local h=$1 i=$2 v=0 s=0 b
	while :; do
		b=$((16#${h:i:2})); i=$((i + 2))
		v=$((v | ((b & 127) << s))); s=$((s + 7))
		((b < 128)) && break
	done
	echo "$v $i"
}

# grpc SERVICE METHOD HEXMSG -> response message hex on stdout
grpc() {
	local svc=$1 method=$2 msg=$3 status
	printf '00%08x%s' $((${#msg} / 2)) "$msg" | hex2bin >"$WORK/req"
	curl -sS --http2-prior-knowledge --unix-socket "$CONTAINERD_SOCK" --max-time 60 \
		-H 'content-type: application/grpc' -H 'te: trailers' \
		--data-binary @"$WORK/req" -D "$WORK/hdr" -o "$WORK/resp" \
		"http://localhost/runtime.v1.$svc/$method" || fail "$method: curl failed"
	status=$(tr -d '\r' <"$WORK/hdr" | awk -F': ' 'tolower($1)=="grpc-status"{print $2}' | tail -1)
	if [[ $status != 0 ]]; then
		fail "$method: grpc-status ${status:-?}: $(tr -d '\r' <"$WORK/hdr" | awk -F': ' 'tolower($1)=="grpc-message"{print $2}')"
	fi
	od -An -v -tx1 "$WORK/resp" | tr -d ' \n' | cut -c11-
}
rt() { grpc RuntimeService "$@"; }

ms() { echo $(($(date +%s%N) / 1000000)); }

sandbox_config() {
	local meta linux pm
	meta=$(fstr 1 smoke)$(fstr 2 smoke-uid-1)$(fstr 3 default)$(fvar 4 0)
	pm=$(fvar 1 0)$(fvar 2 80)$(fvar 3 8080) # TCP 80 -> hostPort 8080
	linux=$(fstr 1 "$RIG_CGROUP_ROOT/pod-smoke")
	printf '%s' "$(fbytes 1 "$meta")$(fstr 2 smoke)$(fstr 3 "$RIG_STATE/pod-logs/smoke")$(fbytes 5 "$pm")$(fmap 6 app smoke)$(fbytes 8 "$linux")"
}

exec_sync() { # CID cmd... -> prints stdout, returns exit code
	local cid=$1 req a resp out code
	shift
	req=$(fstr 1 "$cid")
	for a in "$@"; do req+=$(fstr 2 "$a"); done
	req+=$(fvar 3 10)
	resp=$(rt ExecSync "$req")
	out=$(pbget "$resp" 1 || true)
	code=$(pbget "$resp" 3 || echo 0)
	[[ -n $out ]] && printf '%s' "$out" | hex2bin
	return "$code"
}

in_netns() { nsenter --net="$RIG_NETNS_PATH" "$@"; }

case $MODE in
run)
	mkdir -p "$RIG_STATE/pod-logs/smoke"
	v=$(rt Version "$(fstr 1 v1)")
	say "Version: runtime $(pbget "$v" 2 | hex2bin) $(pbget "$v" 3 | hex2bin), CRI $(pbget "$v" 4 | hex2bin)"
	st=$(grpc ImageService ImageStatus "$(fbytes 1 "$(fstr 1 "$RIG_BUSYBOX_IMAGE")")")
	[[ -n $(pbget "$st" 1 || true) ]] || fail "ImageStatus: $RIG_BUSYBOX_IMAGE not present"
	say "ImageStatus $RIG_BUSYBOX_IMAGE: present"
	sc=$(sandbox_config)
	t0=$(ms)
	r=$(rt RunPodSandbox "$(fbytes 1 "$sc")")
	pod=$(pbget "$r" 1 | hex2bin)
	t1=$(ms)
	cc=$(fbytes 1 "$(fstr 1 web)$(fvar 2 0)")$(fbytes 2 "$(fstr 1 "$RIG_BUSYBOX_IMAGE")")
	cc+=$(fstr 3 httpd)$(fstr 4 -f)$(fstr 4 -p)$(fstr 4 80)$(fstr 4 -h)$(fstr 4 /var/www)
	cc+=$(fstr 11 web.log)
	r=$(rt CreateContainer "$(fstr 1 "$pod")$(fbytes 2 "$cc")$(fbytes 3 "$sc")")
	cid=$(pbget "$r" 1 | hex2bin)
	t2=$(ms)
	rt StartContainer "$(fstr 1 "$cid")" >/dev/null
	t3=$(ms)
	echo "$pod $cid" >"$IDS"
	say "RunPodSandbox $((t1 - t0)) ms, CreateContainer $((t2 - t1)) ms, StartContainer $((t3 - t2)) ms"
	say "pod $pod container $cid"
	exec_sync "$cid" sh -c 'echo hello-from-pod > /var/www/index.html' >/dev/null || fail "ExecSync write"
	ip=$(exec_sync "$cid" sh -c "ip -4 -o addr show eth0 | awk '{print \$4}' | cut -d/ -f1") || fail "ExecSync ip"
	[[ $ip =~ ^[0-9.]+$ ]] || fail "no pod IP (got '$ip')"
	say "pod IP $ip"
	out=$(in_netns timeout 5 busybox wget -q -O - "http://$ip:80/") || fail "HTTP to pod IP $ip from the rig netns"
	[[ $out == hello-from-pod ]] || fail "unexpected HTTP body '$out'"
	say "HTTP pod IP: ok"
	gw=$(in_netns ip -4 -o addr show cni0 | awk '{print $4}' | cut -d/ -f1)
	out=$(in_netns timeout 5 busybox wget -q -O - "http://$gw:8080/") || fail "HTTP to hostPort $gw:8080"
	[[ $out == hello-from-pod ]] || fail "unexpected hostPort body '$out'"
	say "HTTP hostPort via portmap ($gw:8080): ok"
	oom=$(exec_sync "$cid" cat /proc/1/oom_score_adj) || true
	cg=$(exec_sync "$cid" cat /proc/self/cgroup | grep -m1 memory || true)
	say "container oom_score_adj=$oom, $cg"
	echo "OK pod=$pod container=$cid ip=$ip"
	;;
check)
	read -r pod cid <"$IDS"
	out=$(exec_sync "$cid" cat /var/www/index.html) || fail "ExecSync after restart"
	[[ $out == hello-from-pod ]] || fail "unexpected '$out'"
	echo "OK container $cid answers ExecSync"
	;;
clean)
	read -r pod cid <"$IDS"
	rt StopPodSandbox "$(fstr 1 "$pod")" >/dev/null
	rt RemovePodSandbox "$(fstr 1 "$pod")" >/dev/null
	rm -f "$IDS"
	echo "OK pod $pod removed"
	;;
*) fail "unknown mode $MODE" ;;
esac
