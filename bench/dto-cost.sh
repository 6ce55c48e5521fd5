#!/bin/bash
# dto-cost.sh: what a data transfer costs the CPU on the verbs path (issue 21),
# in the soft-RoCE guest (scripts/rxe-vm: rxe0, 192.0.2.1, GID index 1).
# On a NIC the bytes move without the CPU; what a user feels is the work of
# the libraries between the call and the doorbell. That work is the same
# instructions in the emulated guest as on a host with a NIC, so it is
# counted, not timed:
#
#   per DTO   datperf's client (8 B RDMA read, 8 B RDMA write ping-pong, 8 B
#             send ping-pong with its receive reposted; pipeline 1; polling
#             with dat_evd_dequeue (-p) and blocking with dat_evd_wait) under
#             valgrind --tool=callgrind and under strace -f -c, over rs-rxe0
#             (ours) and over ofa-v2-rxe (OFED's libdaplofa.so.2 through the
#             same datperf and libdat2), and perftest's ib_{read,write,send}_lat
#             client for raw verbs. Each run twice (COST_N1 and COST_N2
#             iterations); the difference divided by COST_N2 - COST_N1 is the
#             cost of one iteration with set-up and teardown cancelled out:
#             user-space instructions by object (bench/cgsum.awk), calls to
#             the malloc family, system calls (sched_yield, a wait's own
#             choice in datperf, and clock_gettime, which the vDSO answers on
#             a host, counted apart) and polls made.
#   rates     message rate: 8 B RDMA writes and sends, 64 in flight, datperf
#             -p (ours, OFED's) against ib_write_bw / ib_send_bw -t 64, and
#             connection rate: Debian's dtestcm (ours, OFED's); RATE_ROUNDS
#             rounds, interleaved, medians.
#
#   bench/dto-cost.sh                 boots a guest, prints the table
#   bench/dto-cost.sh --inside DIR    the measurements, in a guest already up
#                                     (run-bench-guest.sh calls this)
#
# Env: COST_N1 (100), COST_N2 (300), RATE_ROUNDS (3), RATE_ITERS (20000),
#      CM_CONNS (200), COST_TESTS ("read_lat write_lat send_lat"), COST_MODES
#      ("poll block"), STEP_TIMEOUT (300 s per client), GUEST_VM_TIMEOUT (2400).
# Output: DIR/cost-table.txt, with the raw callgrind and strace files under
# DIR/cg and DIR/st (default DIR: build/bench/dto-cost).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
# shellcheck source=guest-lib.sh
. "$here/guest-lib.sh"
COST_N1=${COST_N1:-100}
COST_N2=${COST_N2:-300}
RATE_ROUNDS=${RATE_ROUNDS:-3}
RATE_ITERS=${RATE_ITERS:-20000}
CM_CONNS=${CM_CONNS:-200}
COST_TESTS=${COST_TESTS:-read_lat write_lat send_lat}
COST_MODES=${COST_MODES:-poll block}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
DATPERF_QUAL=18525
PERFTEST_PORT=18526
DTESTCM_PORT=15828      # dtestcm's own address exchange
export COST_N1 COST_N2 RATE_ROUNDS RATE_ITERS CM_CONNS COST_TESTS COST_MODES STEP_TIMEOUT

# ================================================================ host side
if [ "${1:-}" != --inside ]; then
	out=$top/build/bench/dto-cost
	install_guest_debs dto-cost || exit 1
	for f in build/lib/libdat2.so.2 build/lib/libdaplrs-verbs.so.2 build/bin/datperf; do
		[ -e "$top/$f" ] || { echo "dto-cost: $f is missing (make, then make -C bench)" >&2; exit 1; }
	done
	rm -rf "$out"
	mkdir -p "$out"
	"$top/scripts/rxe-vm" -t "${GUEST_VM_TIMEOUT:-2400}" -w "$out" -- "$here/dto-cost.sh" --inside "$out"
	rc=$?
	[ -s "$out/cost-table.txt" ] || { echo "dto-cost: the guest did not finish (rxe-vm status $rc)" >&2; exit 1; }
	cat "$out/cost-table.txt"
	[ -s "$out/failures.txt" ] && { echo "FAILED runs:"; cat "$out/failures.txt"; exit 1; }
	exit 0
fi

# =============================================================== guest side
out=$2
# shellcheck source=lib.sh
. "$here/lib.sh"
mkdir -p "$out/logs" "$out/cg" "$out/st"
cd "$out" || exit 1
: >failures.txt
: >cost.txt
: >rates.txt
cat >dat.conf <<EOF
$OURS u2.0 nonthreadsafe default libdaplrs-verbs.so.2 dapl.2.0 "verbs $DEV 1" ""
$OFED u2.0 nonthreadsafe default libdaplofa.so.2 dapl.2.0 "rxenet0 0" ""
EOF
export LD_LIBRARY_PATH=$top/build/lib DAT_OVERRIDE=$out/dat.conf
datperf=$top/build/bin/datperf
# The commit measured: the tree's state now, not when the table is written.
commit=$(git -C "$top" describe --always --dirty 2>/dev/null || echo '?')
server_pid=""
trap 'stop_pid "$server_pid"' EXIT
t0=$SECONDS

# st_calls FILE: system calls in an `strace -c` summary, sched_yield (datperf's own choice
# between polls) and clock_gettime (the vDSO answers it on a host; the emulated guest's
# clock source sends it to the kernel) left out; st_clock FILE: the clock_gettime calls.
st_calls() {
	awk '$4 ~ /^[0-9]+$/ && $NF != "total" && $NF != "sched_yield" && $NF != "clock_gettime" { n += $4 }
		END { print n + 0 }' "$1"
}
st_clock() { awk '$NF == "clock_gettime" { n += $4 } END { print n + 0 }' "$1"; }

# retried TAG READY -- SERVER... -- CLIENT...: run_pair, up to three times. A client under
# callgrind in the emulated guest runs fifty times slower than native, and rdma_cm's
# handshake can time out on it (a reject after 40 s) when the host is busy.
retried() {
	local try mark
	for try in 1 2 3; do
		mark=$(stat -c %s failures.txt)
		run_pair "$@" && return 0
		[ $try = 3 ] && return 1
		truncate -s "$mark" failures.txt
		echo "  retry $1 ($try failed)"
	done
}

# measure TAG N READY -- SERVER... -- CLIENT...: the client under callgrind,
# then under strace; appends "TAG N key value" lines to cost.txt.
measure() {
	local tag=$1 n=$2 ready=$3 srv=() cli=()
	shift 4
	while [ "$1" != -- ]; do srv+=("$1"); shift; done
	shift
	cli=("$@")
	retried "$tag-$n-cg" "$ready" -- "${srv[@]}" -- \
		valgrind -q --tool=callgrind --callgrind-out-file="cg/$tag-$n.out" "${cli[@]}" || return 1
	retried "$tag-$n-st" "$ready" -- "${srv[@]}" -- \
		strace -f -c -o "st/$tag-$n.txt" "${cli[@]}" || return 1
	awk -f "$here/cgsum.awk" -v COUNT='^(dat_evd_dequeue|dat_evd_wait)$' "cg/$tag-$n.out" |
		sed "s/^/$tag $n /" >>cost.txt
	echo "$tag $n syscalls $(st_calls "st/$tag-$n.txt")" >>cost.txt
	echo "$tag $n clock_gettime $(st_clock "st/$tag-$n.txt")" >>cost.txt
	echo "  ok   $tag n=$n [$((SECONDS - t0)) s]"
}

dat_cost() {  # WHO IA TEST MODE(poll|block)
	local p="" n
	[ "$4" = poll ] && p=-p
	for n in $COST_N1 $COST_N2; do
		measure "$1-$3-$4" "$n" "line:server listening" \
			-- "$datperf" -P "$2" -s -q $DATPERF_QUAL -t "$3" -S 8 -A 120 -T 120 $p \
			-- "$datperf" -P "$2" -h $ADDR -q $DATPERF_QUAL -t "$3" -S 8 -n "$n" -T 120 $p || return 0
	done
}
raw_cost() {  # TEST (read_lat|write_lat|send_lat)
	local n args
	for n in $COST_N1 $COST_N2; do
		args=(-d $DEV -i 1 -x $GID_INDEX -p $PERFTEST_PORT -F -s 8 -n "$n")
		measure "raw-$1-poll" "$n" "tcp:$PERFTEST_PORT" \
			-- "ib_$1" "${args[@]}" -- "ib_$1" "${args[@]}" $ADDR || return 0
	done
}

# Rates: "ROUND FIGURE WHO VALUE" in rates.txt.
rate() { if [ -n "$4" ]; then echo "$*" >>rates.txt; else fail_run "r$1-$2-$3" "no figure"; fi; }
dat_rate() {  # ROUND WHO IA TEST
	local tag=r$1-$4-$2
	run_pair "$tag" "line:server listening" \
		-- "$datperf" -P "$3" -s -q $DATPERF_QUAL -t "$4" -S 8 -A 120 -p \
		-- "$datperf" -P "$3" -h $ADDR -q $DATPERF_QUAL -t "$4" -S 8 -N "$RATE_ITERS" -B 0 -w 64 -p ||
		return 0
	# datperf's bandwidth row: "TEST 8 ITERS - - MB/s US_PER_MESSAGE": messages per second.
	rate "$1" "$4" "$2" "$(awk -v t="$4" '$1 == t && $2 == 8 && $7 > 0 { printf "%.0f", 1e6 / $7 }' "logs/$tag-client.log")"
}
raw_rate() {  # ROUND TEST(write_bw|send_bw)
	local tag=r$1-$2-raw args=(-d $DEV -i 1 -x $GID_INDEX -p $PERFTEST_PORT -F -s 8 -n "$RATE_ITERS" -t 64)
	run_pair "$tag" "tcp:$PERFTEST_PORT" -- "ib_$2" "${args[@]}" -- "ib_$2" "${args[@]}" $ADDR || return 0
	# perftest: "#bytes #iterations BW peak BW average MsgRate[Mpps]"
	rate "$1" "$2" raw "$(awk '/MsgRate/ { h = 1; next } h && $1 == 8 { printf "%.0f", $5 * 1e6; exit }' "logs/$tag-client.log")"
}
cm_rate() {  # ROUND WHO IA
	local tag=r$1-cm-$2
	run_pair "$tag" "tcp:$DTESTCM_PORT" -- dtestcm -P "$3" -s -c "$CM_CONNS" \
		-- dtestcm -P "$3" -h $ADDR -c "$CM_CONNS" || return 0
	rate "$1" cm "$2" "$(sed -n 's/.*Connections:.*CPS *\([0-9.]*\).*/\1/p' "logs/$tag-client.log" | head -1)"
}

echo "dto-cost: guest up: $(nproc) vCPUs, kernel $(uname -r); $COST_N1 and $COST_N2 iterations per cost run"
for t in $COST_TESTS; do
	for m in $COST_MODES; do
		dat_cost ours $OURS $t $m
		dat_cost ofed $OFED $t $m
	done
	raw_cost $t
done
for ((r = 1; r <= RATE_ROUNDS; r++)); do
	for t in write_bw send_bw; do
		dat_rate "$r" ours $OURS $t
		dat_rate "$r" ofed $OFED $t
		raw_rate "$r" $t
	done
	cm_rate "$r" ours $OURS
	cm_rate "$r" ofed $OFED
done
took=$((SECONDS - t0))
awk -v n1="$COST_N1" -v n2="$COST_N2" -v took="$took" -v commit="$commit" \
	-f "$here/dto-cost-table.awk" cost.txt rates.txt >cost-table.txt
sync
exit 0
