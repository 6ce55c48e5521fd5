#!/bin/bash
# run-bench-scale.sh: `make -C bench bench-scale` (and part of `make bench`).
# What a message costs with N connections (issue 37): bench/datscale, two
# processes on this host, the server accepting N connections on one PSP, every
# EP of a side sharing one receive, one request and one connection EVD, then
# an 8 B send/recv ping-pong, both sides spinning on dat_evd_dequeue (no
# sched_yield) and reaping each send's completion:
#   mode one   every round trip on one EP (the others idle)
#   mode all   each round trip on the next EP in turn (every EP active)
# at N = 1, 64, 256, 1024, 4096 on
#   rs-tcp-lo    rs-tcp over TCP on loopback (DAPLRS_SAME_HOST=never)
#   rs-tcp-host  rs-tcp on its same-host path as users get it (DAPLRS_SAME_HOST=auto: set up
#                at a connection's first request, which goes over TCP)
#   rs-ofi-tcp   "ofi tcp 127.0.0.1"         libfabric tcp (FI_EP_MSG)
#   rs-ofi-shm   "ofi shm"                   libfabric shm (FI_EP_RDM, our connections)
#   rs-ofi-rxm   "ofi tcp;ofi_rxm 127.0.0.1" libfabric tcp;ofi_rxm (FI_EP_RDM)
# One table: per entry and N, the median round trip (and p99) of each mode, its
# ratio to N = 1 in the same round (issue 37's target: at most 1.3x at 1,024),
# the RSS growth per connection of each side (KiB, target at most 64) and the
# connection rate (connections set up per second: a connect and an accept each;
# target at least 5,000). ROUNDS (default 3) interleaved rounds, each running
# every entry at every N (both modes on one set of connections, the order of the
# modes alternating); every figure is the median of the rounds.
#
# Knobs: ROUNDS (3), ENTRIES (all five), NS ("1 64 256 1024 4096"), ITERS (10000
# round trips per mode at most), BUDGET (10: a mode's measured loop stops after
# that many seconds, at least 100 round trips), STEP_TIMEOUT (240 s per server
# and client), MEM_FLOOR_MB (2048: a run is stopped, its cell "failed (memory)",
# when the host's MemAvailable falls below it; a point whose RSS, estimated from
# the entry's figures at a smaller N, would not fit in what is available is
# skipped, its cell saying so).
#
#   ./run-bench-scale.sh        ROUNDS=1 ./run-bench-scale.sh
#   ENTRIES="rs-tcp-lo rs-tcp-host" NS="1 1024" ./run-bench-scale.sh
#   OFI_LIB=/tmp/other-libdaplrs-ofi.so.2 ./run-bench-scale.sh      (another ofi build)
#
# A failing point prints 'failed' in its cell (its logs say why) and the run goes
# on. Every server and client runs under `timeout`, the server waited for by its
# ready line; raw outputs in build/bench/scale/ (ENTRY-nN-rR-{server,client}.txt).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
# shellcheck source=lib.sh
. "$here/lib.sh"

ROUNDS=${ROUNDS:-3}
ENTRIES=${ENTRIES:-rs-tcp-lo rs-tcp-host rs-ofi-tcp rs-ofi-shm rs-ofi-rxm}
NS=${NS:-1 64 256 1024 4096}
ITERS=${ITERS:-10000}
BUDGET=${BUDGET:-10}
STEP_TIMEOUT=${STEP_TIMEOUT:-240}
MEM_FLOOR_MB=${MEM_FLOOR_MB:-2048}
SCALE_QUAL=18719
bin=$top/build/bin
out=$top/build/bench/scale
conf=$out/ofi-dat.conf
results=$out/results.txt
mkdir -p "$out"
rm -f "$out"/*.txt
server_pid="" client_pid=""
trap 'stop_pid "$client_pid"; stop_pid "$server_pid"' EXIT

[ -x "$bin/datscale" ] || { echo "error: $bin/datscale missing (make -C bench)" >&2; exit 1; }
[ -f "$top/build/lib/libdaplrs.so.2" ] || { echo "error: build/lib/libdaplrs.so.2 missing (make at the top)" >&2; exit 1; }
lib=${OFI_LIB:-$top/build/lib/libdaplrs-ofi.so.2}

# Each entry: its IA, its dat.conf, its same-host setting, a description.
declare -A ia conffile samehost what
ia[rs-tcp-lo]=rs-tcp conffile[rs-tcp-lo]=$top/dat.conf samehost[rs-tcp-lo]=never
ia[rs-tcp-host]=rs-tcp conffile[rs-tcp-host]=$top/dat.conf samehost[rs-tcp-host]=auto
what[rs-tcp-lo]="rs-tcp over TCP (loopback)" what[rs-tcp-host]="rs-tcp, same-host path"
for e in rs-ofi-tcp rs-ofi-shm rs-ofi-rxm; do ia[$e]=$e conffile[$e]=$conf samehost[$e]=auto; done
what[rs-ofi-tcp]="ofi tcp (MSG)" what[rs-ofi-shm]="ofi shm (RDM)" what[rs-ofi-rxm]="ofi tcp;ofi_rxm (RDM)"
for e in $ENTRIES; do
	[ -n "${ia[$e]:-}" ] || { echo "error: no entry $e (${!ia[*]})" >&2; exit 1; }
	case $e in rs-ofi-*) [ -f "$lib" ] || { echo "error: $lib missing (make at the top)" >&2; exit 1; } ;; esac
done
{
	echo "rs-ofi-tcp u2.0 nonthreadsafe default $lib dapl.2.0 \"ofi tcp 127.0.0.1\" \"\""
	echo "rs-ofi-shm u2.0 nonthreadsafe default $lib dapl.2.0 \"ofi shm\" \"\""
	echo "rs-ofi-rxm u2.0 nonthreadsafe default $lib dapl.2.0 \"ofi tcp;ofi_rxm 127.0.0.1\" \"\""
} >"$conf"

# record WHERE KEY VALUE: one figure of one round (WHERE = ENTRY:N).
record() { [ -z "$3" ] || echo "$1 $2 $3" >>"$results"; }

mem_available_mb() { awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo; }

# A field of datscale's line of MODE: field NAME LOG MODE.
field() {
	awk -v k="$1" -v m="mode=$3" '$1 == "scale" && $4 == m {
		for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) print kv[2] } }' "$2"
}

# The RSS per connection (KiB, the larger side) the entry showed at its largest N so far:
# what a connection costs once shared costs (an endpoint per EVD set, a progress thread)
# are spread, which N = 1 holds whole (70 MB for tcp;ofi_rxm, 5 MB for shm).
kib_per_conn() {
	awk -v e="$1" '{ split($1, w, ":") } w[1] == e && ($2 == "rss_c" || $2 == "rss_s") {
			n = w[2] + 0
			if (n > top) { top = n; m = 0 }
			if (n == top && $3 > m) m = $3 }
		END { print m + 0 }' "$results" 2>/dev/null || echo 0
}

# point ENTRY N ROUND: one server and one client, both modes; records the figures,
# or why there are none (fail_one, fail_all, skip).
point() {
	local e=$1 n=$2 r=$3 log=$out/$1-n$2-r$3 modes=one,all where=$1:$2
	((r % 2)) || modes=all,one
	# Room for it? Both processes at the entry's worst RSS per connection so far.
	local need=$(($(kib_per_conn "$e" | cut -d. -f1) * n * 2 / 1024)) avail
	avail=$(mem_available_mb)
	if ((need > 0 && need + MEM_FLOOR_MB > avail)); then
		echo "  $e N=$n: skipped, needs about $need MB (RSS per connection at a smaller N), $avail MB available"
		record "$where" skip "$need"
		return
	fi
	local env=(env LD_LIBRARY_PATH="$top/build/lib" DAT_OVERRIDE="${conffile[$e]}" DAPLRS_SAME_HOST="${samehost[$e]}")
	: >"$log-server.txt"
	timeout -k 5 "$STEP_TIMEOUT" "${env[@]}" "$bin/datscale" -P "${ia[$e]}" -s -c "$n" -q $SCALE_QUAL -A 60 -T 60 \
		>"$log-server.txt" 2>&1 &
	server_pid=$!
	if ! wait_for_line "$log-server.txt" "server listening" 30 "$server_pid" 2>>"$log-client.txt"; then
		stop_pid "$server_pid"
		server_pid=""
		echo "  $e N=$n: failed: the server did not start: $(grep -v '^ *|' "$log-server.txt" | tail -1)"
		record "$where" fail_one 1
		record "$where" fail_all 1
		return
	fi
	timeout -k 5 "$STEP_TIMEOUT" "${env[@]}" "$bin/datscale" -P "${ia[$e]}" -h 127.0.0.1 -q $SCALE_QUAL -c "$n" \
		-m $modes -n "$ITERS" -D "$BUDGET" -T 60 >"$log-client.txt" 2>&1 &
	client_pid=$!
	# The memory guard: a run that would starve the host is stopped.
	local starved=""
	while kill -0 "$client_pid" 2>/dev/null; do
		if (($(mem_available_mb) < MEM_FLOOR_MB)); then
			starved=1
			stop_pid "$client_pid"
			stop_pid "$server_pid"
			break
		fi
		sleep 0.2
	done
	wait "$client_pid" 2>/dev/null
	local rc=$?
	client_pid=""
	wait "$server_pid" 2>/dev/null
	server_pid=""
	local m got="" said=""
	for m in one all; do
		local med
		med=$(field rtt_med_us "$log-client.txt" $m)
		if [ -z "$med" ]; then
			record "$where" "fail_$m" 1
			continue
		fi
		record "$where" "${m}_med" "$med"
		record "$where" "${m}_p99" "$(field rtt_p99_us "$log-client.txt" $m)"
		said+=" $m $med us"
		# The ratio to N = 1 of this round (N = 1 runs first).
		local base
		base=$(field rtt_med_us "$out/$e-n1-r$r-client.txt" $m 2>/dev/null)
		[ -n "$base" ] && record "$where" "${m}_ratio" "$(awk -v a="$med" -v b="$base" 'BEGIN { if (b > 0) printf "%.3f\n", a / b }')"
		# The connection figures once a point (both modes' lines carry the same).
		[ -n "$got" ] && continue
		got=1
		record "$where" rss_c "$(field rss_kib_per_conn_client "$log-client.txt" $m)"
		record "$where" rss_s "$(field rss_kib_per_conn_server "$log-client.txt" $m)"
		record "$where" conn_rate "$(field conn_per_s "$log-client.txt" $m)"
	done
	[ -z "$said" ] || echo "  $e N=$n:$said"
	local why
	why=$(grep -h "^datscale" "$log-client.txt" "$log-server.txt" | grep -v "listening\|accepted in\|server done" | head -1)
	if [ -n "$starved" ]; then
		echo "  $e N=$n: failed: stopped, MemAvailable fell below $MEM_FLOOR_MB MB"
		record "$where" mem 1
	elif [ -z "$got" ] || [ "$rc" != 0 ] || [ -n "$why" ]; then
		echo "  $e N=$n: ${got:+partly }failed (exit status $rc): ${why:-see ${log#"$top"/}-client.txt}"
	fi
}

print_table() {
	awk -v rounds="$ROUNDS" -v entries="$ENTRIES" -v ns="$NS" "$awk_rounds"'
	function cell(w, m,   x, p) {
		x = med(w, m "_med"); p = med(w, m "_p99")
		if (x != "") return sprintf("%.1f (%.0f)", x, p)
		if (n[w SUBSEP "skip"]) return "skipped"
		if (n[w SUBSEP "mem"]) return "failed (memory)"
		return n[w SUBSEP "fail_" m] ? "failed" : "-"
	}
	function ratio(w, m,   x) { x = med(w, m "_ratio"); return x == "" ? "-" : sprintf("%.2fx", x) }
	END {
		ne = split(entries, e, " "); nn = split(ns, N, " ")
		printf "%-28s %5s  %-18s %7s  %-18s %7s  %15s  %8s\n", "entry", "N", "one: med (p99) us", "x N=1",
		       "all: med (p99) us", "x N=1", "RSS KiB/conn c/s", "conn/s"
		for (i = 1; i <= ne; i++) {
			for (j = 1; j <= nn; j++) {
				w = e[i] ":" N[j]
				c = med(w, "rss_c"); s = med(w, "rss_s"); r = med(w, "conn_rate")
				printf "%-28s %5s  %-18s %7s  %-18s %7s  %15s  %8s\n", j == 1 ? e[i] : "", N[j],
				       cell(w, "one"), ratio(w, "one"), cell(w, "all"), ratio(w, "all"),
				       c == "" ? "-" : sprintf("%.1f / %.1f", c, s), f(r, 0)
			}
		}
		printf "medians of %d interleaved round(s); x N=1: the median of each round'"'"'s ratio to N = 1 of that round\n", rounds
	}' "$results"
	local e
	for e in $ENTRIES; do printf '%-12s %s\n' "$e" "${what[$e]}"; done
}

start_s=$SECONDS
echo "# bench-scale: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), $(mem_available_mb) MB available," \
	"commit $(git -C "$top" describe --always --dirty 2>/dev/null || echo '?'), entries $ENTRIES, N $NS" | tee "$out/host.txt"
: >"$results"
for r in $(seq "$ROUNDS"); do
	echo "== round $r/$ROUNDS [$((SECONDS - start_s)) s]"
	for e in $ENTRIES; do
		for n in $NS; do point "$e" "$n" "$r"; done
	done
done
echo "# after: load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/host.txt"
{
	print_table
	echo "round trip: posting an 8 B send to having the reply and the send's completion, both sides spinning on"
	echo "dat_evd_dequeue; one = every round trip on one EP, all = on each EP in turn. RSS: VmRSS growth from"
	echo "before the first EP to all N connected, per connection, client / server. conn/s: N / the client's time"
	echo "from its first dat_ep_create to its last ESTABLISHED (connects + accepts)."
	echo "Targets (issue 37): at 1,024 at most 1.3x N=1, RSS at most 64 KiB per connection, 5,000 conn/s."
} | tee "$out/table.txt"
echo "(run took $((SECONDS - start_s)) s; raw outputs in ${out#"$top"/})"
