#!/usr/bin/env bash
# Network faults between two hosts (issue 11, item 4): network namespaces
# joined by a veth pair as in two-hosts.sh (addresses from TEST-NET-2, only
# inside these namespaces), a test_faults server in one and a client in the
# other over rs-tcp, each with its own dat.conf naming its own interface.
# Faults, one scenario each (see test_faults.c for what each side checks):
#
#   integrity   the link impaired both ways: delay with jitter, loss,
#               reordering, duplication (tc netem); every byte checked
#   linkdown    the link taken down mid-transfer: BROKEN within the bound
#   flap        the link down for half the detection time, then up: no event
#   idle        the link taken down on an idle connection: BROKEN (keepalive)
#   stop-small  the server stopped (SIGSTOP) with a few DTOs posted: they
#               wait, the connection stays up; SIGCONT: they complete
#   stop-flood  the server stopped, the client posting 256 KiB sends as fast
#               as accepted: refusals, bounded RSS, BROKEN or waiting
#
# The provider's dead-peer detection time is set short for the test
# (DAPLRS_PEER_TIMEOUT_MS=$NET_FAULTS_DETECT_MS, default 2000). With
# NET_FAULTS_LONG=1 (`make net-faults-long`) the provider's default applies
# and the impaired run is longer.
#
# The netem qdisc needs sch_netem in the kernel. Where it is missing the
# impairments are applied by tests-c/programs/impair.c instead (a userspace link over
# TUN devices: same delay, loss, reordering, duplication), and the missing
# netem is reported as a failure, loudly: it is never skipped silently.
# NET_FAULTS_NETEM=optional makes the userspace link acceptable: `make test`
# sets it, because the kernels of this project's machines and CI (6.18 with
# no sch_netem, no modules) cannot load netem; the faults are injected either
# way, and the banner says which link carried them.
set -u
# Two "hosts" in namespaces of one machine: the TCP path is what is under test, so the
# same-host path (which would otherwise carry RDMA between them) is turned off.
export DAPLRS_SAME_HOST=never
top=$(cd "$(dirname "$0")/../.." && pwd)
bin=${NET_FAULTS_BIN:-$top/build/tests/test_faults}
impair=${NET_FAULTS_IMPAIR:-$top/build/tests/impair}
lib=${NET_FAULTS_LIB:-$top/build/lib}
out=${NET_FAULTS_OUT:-$top/build/tests/net-faults}
long=${NET_FAULTS_LONG:-0}
if [ "$long" = 1 ]; then
	detect=30000 rounds=${NET_FAULTS_ROUNDS:-300} peer_env=()
else
	detect=${NET_FAULTS_DETECT_MS:-2000} rounds=${NET_FAULTS_ROUNDS:-16}
	peer_env=(DAPLRS_PEER_TIMEOUT_MS=$detect)
fi
mkdir -p "$out"
: > "$out/results.txt"
tag=udnf$$
a=${tag}a b=${tag}b
passed=0 failed=0
pids=()
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "net-faults: FAIL: $*"; }
cleanup() {
	for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
	ip netns del "$a" 2>/dev/null
	ip netns del "$b" 2>/dev/null
}
trap cleanup EXIT

if ! ip netns add "$a" || ! ip netns add "$b"; then
	echo "net-faults: cannot create network namespaces (need root and iproute2)"
	echo "net-faults: 0 passed, 1 failed"
	exit 1
fi
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done

# The link: veth (with netem if the kernel has it) or two TUN devices joined
# by the userspace impairer.
ip link add veth-$a netns "$a" type veth peer name veth-$b netns "$b"
ip -n "$a" addr add 198.51.100.1/24 dev veth-$a
ip -n "$b" addr add 198.51.100.2/24 dev veth-$b
ip -n "$a" link set veth-$a up
ip -n "$b" link set veth-$b up
if ip netns exec "$a" tc qdisc add dev veth-$a root netem delay 1ms 2>"$out/netem.err"; then
	ip netns exec "$a" tc qdisc del dev veth-$a root
	netem=1
else
	netem=0
	echo "net-faults: ************************************************************************"
	echo "net-faults: the netem qdisc is not available: $(cat "$out/netem.err")"
	echo "net-faults: (the kernel lacks sch_netem: $(modprobe sch_netem 2>&1 || true))"
	echo "net-faults: impairments are applied by the userspace link (impair) instead"
	echo "net-faults: ************************************************************************"
	if [ "${NET_FAULTS_NETEM:-required}" = optional ]; then ok; else bad "sch_netem missing in kernel $(uname -r)"; fi
fi

for side in a b; do
	ns=${tag}$side
	echo "rs-tcp u2.0 nonthreadsafe default libdaplrs.so.2 dapl.2.0 \"tcp veth-$ns\" \"\"" > "$out/dat.conf.$side"
	echo "rs-tcp u2.0 nonthreadsafe default libdaplrs.so.2 dapl.2.0 \"tcp tun-$ns\" \"\"" > "$out/dat.conf.tun.$side"
done
conf=dat.conf
in_ns() {
	local side=$1; shift
	ip netns exec ${tag}$side env LD_LIBRARY_PATH="$lib" DAT_OVERRIDE="$out/$conf.$side" "${peer_env[@]}" \
		FAULTS_ROUNDS=$rounds "$@"
}

# Waits (bounded) until file $1 has a line matching $2.
wait_for() {
	local f=$1 pat=$2 limit=$3 i
	for ((i = 0; i < limit * 20; i++)); do
		grep -q "$pat" "$f" 2>/dev/null && return 0
		sleep 0.05
	done
	return 1
}
# Sets the server's end of the link up and waits (bounded) until both ends
# have carrier: a connect before that finds no route.
link_up() {
	local i
	ip -n "$a" link set veth-$a up
	# neighbour entries that failed while the link was down would refuse the next connect
	ip -n "$a" neigh flush dev veth-$a 2>/dev/null
	ip -n "$b" neigh flush dev veth-$b 2>/dev/null
	for ((i = 0; i < 200; i++)); do
		ip -n "$a" link show veth-$a | grep -q LOWER_UP && ip -n "$b" link show veth-$b | grep -q LOWER_UP &&
			return 0
		sleep 0.05
	done
	bad "veth-$a has no carrier after link up"
}
# Waits (bounded) until process $1 is stopped.
wait_stopped() {
	local i
	for ((i = 0; i < 200; i++)); do
		[ "$(awk '{print $3}' /proc/$1/stat 2>/dev/null)" = T ] && return 0
		sleep 0.05
	done
	return 1
}
# Waits for job $1 (ip netns exec running the program), then reads its "N
# passed, N failed" line from log $2: one pass when the side passed every
# check and exited 0.
finish() {
	local job=$1 log=$2 rc line f
	wait "$job"; rc=$?
	line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
	f=$(sed -E 's/.* ([0-9]+) passed, ([0-9]+) failed.*/\2/' <<<"$line")
	if [ -n "$line" ] && [ "$f" = 0 ] && [ "$rc" = 0 ]; then
		ok
	else
		bad "$(basename "$log") ($f failed checks, exit $rc)"
		grep -E '^FAIL' "$log" | head -5
	fi
	grep '^RESULT' "$log" | tee -a "$out/results.txt"
}

port=7000
saddr=198.51.100.1
# The pid a program prints first (ip netns exec may fork: signals must go to
# the program itself).
pid_of() {
	wait_for "$1" '^PID ' 10 && sed -n 's/^PID \([0-9]*\)$/\1/p' "$1" | head -1
}
# start <scenario>: server in a, client in b; sets sjob, cjob (jobs), spid,
# cpid (the programs), slog, clog.
start() {
	local sc=$1
	port=$((port + 1))
	slog=$out/$sc.server.log clog=$out/$sc.client.log
	in_ns a "$bin" server $port "$sc" > "$slog" 2>&1 &
	sjob=$!
	spid=$(pid_of "$slog")
	pids+=("$sjob" $spid)
	if ! wait_for "$slog" READY 20; then bad "$sc: server not ready (see $slog)"; return 1; fi
	in_ns b "$bin" client $saddr $port "$sc" "$detect" > "$clog" 2>&1 &
	cjob=$!
	cpid=$(pid_of "$clog")
	pids+=("$cjob" $cpid)
	[ -n "$spid" ] && [ -n "$cpid" ] || { bad "$sc: no PID line (see $slog, $clog)"; return 1; }
	return 0
}

detect_s=$(( (detect + 999) / 1000 ))

# NET_FAULTS_ONLY="linkdown flap ...": only these scenarios (development).
want() { [ -z "${NET_FAULTS_ONLY:-}" ] || [[ " $NET_FAULTS_ONLY " == *" $1 "* ]]; }

# ---- integrity: delay, loss, reordering, duplication -------------------------------------
impair_pid=
if ! want integrity; then
	:
elif [ $netem = 1 ]; then
	spec="delay 8ms 4ms loss random 3% duplicate 3% reorder 25% 50%"
	for s in a b; do ip netns exec ${tag}$s tc qdisc add dev veth-${tag}$s root netem $spec; done
	echo "net-faults: netem on both ends: $spec" | tee -a "$out/results.txt"
else
	# TUN devices made here (persistent, owned by root), opened by the impairer in each
	# namespace; the dat.conf entries name them.
	for s in a b; do ip -n ${tag}$s tuntap add dev tun-${tag}$s mode tun; done
	ip -n "$a" addr add 198.51.101.1 peer 198.51.101.2 dev tun-$a
	ip -n "$b" addr add 198.51.101.2 peer 198.51.101.1 dev tun-$b
	for s in a b; do ip -n ${tag}$s link set tun-${tag}$s up; done
	spec="delay 8ms 4ms loss 3% duplicate 3% reorder 25%"
	"$impair" /run/netns/$a tun-$a /run/netns/$b tun-$b 8 4 3 3 25 > "$out/impair.log" 2>&1 &
	impair_pid=$!
	pids+=("$impair_pid")
	wait_for "$out/impair.log" READY 10 || bad "impair not ready (see $out/impair.log)"
	echo "net-faults: userspace link (impair) both ways: $spec" | tee -a "$out/results.txt"
	conf=dat.conf.tun saddr=198.51.101.1
fi
if want integrity && start integrity; then
	finish "$cjob" "$clog"
	finish "$sjob" "$slog"
fi
if ! want integrity; then
	:
elif [ $netem = 1 ]; then
	for s in a b; do ip netns exec ${tag}$s tc qdisc del dev veth-${tag}$s root; done
else
	kill "$impair_pid" 2>/dev/null
	wait "$impair_pid" 2>/dev/null
	grep '^impair:' "$out/impair.log" | tail -1 | tee -a "$out/results.txt"
	conf=dat.conf saddr=198.51.100.1
fi

# ---- linkdown: the server's end taken down mid-transfer ---------------------------------
if want linkdown && start linkdown; then
	if wait_for "$clog" STREAMING 20; then
		ip -n "$a" link set veth-$a down
		kill -USR1 "$cpid" "$spid"
	else
		bad "linkdown: no stream (see $clog)"
	fi
	finish "$cjob" "$clog"
	finish "$sjob" "$slog"
	link_up
fi

# ---- flap: down for half the detection time, then up ------------------------------------
if want flap && start flap; then
	if wait_for "$clog" STREAMING 20; then
		ip -n "$a" link set veth-$a down
		kill -USR1 "$cpid" "$spid"
		sleep "$(awk -v d="$detect" 'BEGIN { printf "%.2f", d / 2000 }')" # the fault's length
		link_up
		kill -USR2 "$cpid" "$spid"
	else
		bad "flap: no stream (see $clog)"
	fi
	finish "$cjob" "$clog"
	finish "$sjob" "$slog"
fi

# ---- idle: the link taken down on an idle connection (keepalive) ------------------------
if want idle && start idle; then
	if wait_for "$clog" CONNECTED 20 && wait_for "$slog" CONNECTED 20; then
		ip -n "$a" link set veth-$a down
		kill -USR1 "$cpid" "$spid"
	else
		bad "idle: not connected (see $clog, $slog)"
	fi
	finish "$cjob" "$clog"
	finish "$sjob" "$slog"
	link_up
fi

# ---- stop-small / stop-flood: the server stopped with SIGSTOP ---------------------------
for sc in stop-small stop-flood; do
	want $sc && start $sc || continue
	[ $sc = stop-small ] && mark=WAITED || mark=FLOODED
	if wait_for "$clog" CONNECTED 20 && wait_for "$slog" CONNECTED 20; then
		kill -STOP "$spid"
		wait_stopped "$spid" || bad "$sc: server not stopped"
		kill -USR1 "$cpid"
		wait_for "$clog" $mark $((4 * detect_s + 30)) || bad "$sc: client never reported $mark (see $clog)"
		kill -CONT "$spid"
		kill -USR2 "$cpid"
	else
		bad "$sc: not connected (see $clog, $slog)"
	fi
	finish "$cjob" "$clog"
	finish "$sjob" "$slog"
done

echo "net-faults: detection time set to $detect ms"
echo "net-faults: $passed passed, $failed failed"
[ $failed -eq 0 ]
