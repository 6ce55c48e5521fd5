#!/bin/bash
# run-bench-ofi.sh: `make -C bench bench-ofi` (and part of `make bench`).
# datperf over each libfabric entry of our ofi backend against ofi-raw, the
# same measurements made with libfabric alone on the same provider, in the
# same run:
#   rs-ofi-tcp  "ofi tcp 127.0.0.1"          tcp, FI_EP_MSG (ofi-raw -e msg)
#   rs-ofi-rxm  "ofi tcp;ofi_rxm 127.0.0.1"  tcp;ofi_rxm, FI_EP_RDM (ofi-raw -e rdm)
#   rs-ofi-shm  "ofi shm"                    shm, FI_EP_RDM (ofi-raw -e rdm)
# Over FI_EP_RDM our backend builds DAT connections of its own (docs/libfabric.md,
# "Connections"); ofi-raw opens its endpoint with the backend's hints (its header
# says what differs). Figures: 8 B RDMA write (one-way, RTT/2) and read latency,
# 1 MiB RDMA write and read bandwidth (8 in flight; reads as many as datperf's IA
# allows). Both poll their completion queues with sched_yield between empty
# looks (datperf -p, ofi-raw's default): like with like. Printed as ratios of raw
# libfabric, one table per entry (issue 25's targets: latency within 1.3x,
# bandwidth at least 0.9x). ROUNDS (default 5) rounds, each running every entry,
# the order of datperf and ofi-raw alternating; every figure is the median of
# the rounds.
#
# Iterations: LAT_ITERS (tcp, default 20000) and RDM_LAT_ITERS (rxm, shm, default
# 5000) latency samples; MEM_ITERS (default 1000) for the RDM write ping-pong
# whose DAT target spins on its memory alone (there each one-way hop waits for
# the target's progress thread's millisecond turn: 1 to 2 ms a sample); SPIN_ITERS
# (default 1000) for the write and send ping-pongs whose two sides spin without
# sched_yield;
# BW_ITERS (default 2048) messages per bandwidth figure. At a load of 2 to 4
# the whole run takes about 4 minutes, a round 40 to 50 s (printed as it goes).
#
#   ./run-bench-ofi.sh      ROUNDS=3 LAT_ITERS=5000 ./run-bench-ofi.sh
#   ENTRIES="rs-ofi-rxm rs-ofi-shm" ./run-bench-ofi.sh            (some entries only)
#   OFI_LIB=/tmp/other-libdaplrs-ofi.so.2 ./run-bench-ofi.sh    (another build, for A/B runs)
#
# Every server runs under `timeout` and is waited for by its ready line;
# raw outputs are kept in build/bench/ofi/ (ENTRY-rN-*.txt).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
# shellcheck source=lib.sh
. "$here/lib.sh"

ROUNDS=${ROUNDS:-5}
LAT_ITERS=${LAT_ITERS:-20000}
RDM_LAT_ITERS=${RDM_LAT_ITERS:-5000}
MEM_ITERS=${MEM_ITERS:-1000}
SPIN_ITERS=${SPIN_ITERS:-1000}
BW_ITERS=${BW_ITERS:-2048}
ENTRIES=${ENTRIES:-rs-ofi-tcp rs-ofi-rxm rs-ofi-shm}
WINDOW=8
DATPERF_QUAL=18617 RAW_PORT=18619
bin=$top/build/bin
out=$top/build/bench/ofi
conf=$out/dat.conf
mkdir -p "$out"
rm -f "$out"/*.txt
server_pid=""
trap 'stop_pid "$server_pid"' EXIT

for t in datperf ofi-raw; do [ -x "$bin/$t" ] || { echo "error: $bin/$t missing (make -C bench)" >&2; exit 1; }; done
lib=${OFI_LIB:-$top/build/lib/libdaplrs-ofi.so.2}
[ -f "$lib" ] || { echo "error: $lib missing (make at the top)" >&2; exit 1; }

# Each entry: its dat.conf ia_params, ofi-raw's endpoint type and provider, a
# description for its table, and its latency iteration counts (write ping-pong
# with the target on memory, the others).
declare -A params raw_ep raw_prov what mem_iters lat_iters read_window
params[rs-ofi-tcp]="ofi tcp 127.0.0.1" raw_ep[rs-ofi-tcp]=msg raw_prov[rs-ofi-tcp]=tcp
params[rs-ofi-rxm]="ofi tcp;ofi_rxm 127.0.0.1" raw_ep[rs-ofi-rxm]=rdm raw_prov[rs-ofi-rxm]="tcp;ofi_rxm"
params[rs-ofi-shm]="ofi shm" raw_ep[rs-ofi-shm]=rdm raw_prov[rs-ofi-shm]=shm
what[rs-ofi-tcp]="ofi tcp (MSG), loopback" what[rs-ofi-rxm]="ofi tcp;ofi_rxm (RDM), loopback"
what[rs-ofi-shm]="ofi shm (RDM)"
for e in $ENTRIES; do
	[ -n "${params[$e]:-}" ] || { echo "error: no entry $e (rs-ofi-tcp, rs-ofi-rxm, rs-ofi-shm)" >&2; exit 1; }
	if [ "${raw_ep[$e]}" = msg ]; then
		mem_iters[$e]=$LAT_ITERS lat_iters[$e]=$LAT_ITERS
	else
		mem_iters[$e]=$MEM_ITERS lat_iters[$e]=$RDM_LAT_ITERS
	fi
	read_window[$e]=$WINDOW
	echo "$e u2.0 nonthreadsafe default $lib dapl.2.0 \"${params[$e]}\" \"\""
done >"$conf"
ours=(env LD_LIBRARY_PATH="$top/build/lib" DAT_OVERRIDE="$conf")

# record ENTRY WHO KEY VALUE: one figure of one round.
record() {
	if [ -n "$4" ]; then echo "$2 $3 $4" >>"$out/results-$1.txt"; else echo "  (no figure for $1 $2 $3)" >&2; fi
}

# start SERVER_LOG READY CMD...: CMD in the background under a timeout, ready by its line.
start() {
	local log=$1 re=$2
	shift 2
	# Emptied here, not by the child's redirection: the wait must not find the
	# ready line a former server left in the same file.
	: >"$log"
	timeout -k 5 300 "$@" >"$log" 2>&1 &
	server_pid=$!
	wait_for_line "$log" "$re" 30 "$server_pid"
}
finish() { wait "$server_pid" 2>/dev/null; server_pid=""; }

# A figure of a datperf or ofi-raw table (same columns): TEST BYTES COLUMN.
figure() { awk -v t="$1" -v b="$2" -v c="$3" '$1 == t && $2 == b { print $c }' "$4"; }

# The figures of a datperf or ofi-raw table as ENTRY WHO's; datperf's
# write ping-pong with the target on memory comes from its own run (below).
record_table() {
	local e=$1 who=$2 f=$3
	[ "$who" = datperf ] || record "$e" "$who" write_lat "$(figure write_lat 8 4 "$f")"
	record "$e" "$who" read_lat "$(figure read_lat 8 4 "$f")"
	record "$e" "$who" write_bw "$(figure write_bw 1048576 6 "$f")"
	record "$e" "$who" read_bw "$(figure read_bw 1048576 6 "$f")"
}

# datperf_pair ENTRY LOG SIZE CLIENT_ARGS...: one datperf server and client
# (server options -e or not as the client's: the last of CLIENT_ARGS). The server
# polls (-p) unless SERVER_POLL is set empty: then it blocks in dat_evd_wait.
datperf_pair() {
	local e=$1 log=$2 size=$3
	shift 3
	local extra=()
	[ "${*: -1}" = -e ] && extra=(-e)
	start "$log-server.txt" "server listening" "${ours[@]}" "$bin/datperf" -P "$e" -s -q $DATPERF_QUAL \
		-S "$size" -A 60 ${SERVER_POLL--p} "${extra[@]}" ${SERVER_SPIN:+-y spin} ||
		{ stop_pid "$server_pid"; server_pid=""; return 1; }
	timeout -k 5 300 "${ours[@]}" "$bin/datperf" -P "$e" -h 127.0.0.1 -q $DATPERF_QUAL -S "$size" -w $WINDOW \
		-p "$@" >>"$log.txt" 2>&1 || echo "  datperf failed: see ${log#"$top"/}.txt" >&2
	finish
}

m_datperf() {
	local e=$1 r=$2 log=$out/$1-r$2-datperf
	: >"$log.txt"
	: >"$log-mem.txt"
	: >"$log-blocked.txt"
	# The write ping-pong with each DAT target spinning on its memory alone.
	datperf_pair "$e" "$log-mem" 8 -t write_lat -n "${mem_iters[$e]}" || return
	record "$e" datperf write_lat "$(figure write_lat 8 4 "$log-mem.txt")"
	# Both sides spin on their memory with no DAT call and no sched_yield (issue
	# 40): a send is placed only by the target's progress thread, rung by the peer.
	: >"$log-spin.txt"
	SERVER_SPIN=1 datperf_pair "$e" "$log-spin" 8 -t write_lat,send_lat -n "$SPIN_ITERS" -y spin || return
	record "$e" datperf spin_write_lat "$(figure write_lat 8 4 "$log-spin.txt")"
	record "$e" datperf spin_send_lat "$(figure send_lat 8 4 "$log-spin.txt")"
	# With -e each side's wait on its memory also dequeues its request EVD, as
	# ofi-raw's reads its CQ (libfabric's tcp, ofi_rxm and shm place the peer's
	# data only inside a call of the target: like with like). read_lat has no
	# wait on memory: -e changes nothing for it.
	datperf_pair "$e" "$log" 8 -t write_lat,read_lat -n "${lat_iters[$e]}" -e || return
	record "$e" datperf write_lat_evd "$(figure write_lat 8 4 "$log.txt")"
	datperf_pair "$e" "$log" 1M -t write_bw,read_bw -N "$BW_ITERS" -B 4096 || return
	# ofi-raw keeps as many reads in flight as datperf could.
	local w
	w=$(sed -n 's/.*(RDMA reads \([0-9]*\)).*/\1/p' "$log.txt" | head -1)
	[ -n "$w" ] && read_window[$e]=$w
	record_table "$e" datperf "$log.txt"
	# The same reads from a DAT target blocked in dat_evd_wait: served by its
	# progress thread (woken by our doorbell on one host, libfabric.md).
	SERVER_POLL= datperf_pair "$e" "$log-blocked" 1M -t read_bw -N "$BW_ITERS" -B 4096 || return
	record "$e" datperf read_bw_blocked "$(figure read_bw 1048576 6 "$log-blocked.txt")"
}

m_raw() {
	local e=$1 r=$2 log=$out/$1-r$2-raw
	local mode=(-e "${raw_ep[$e]}" -P "${raw_prov[$e]}")
	start "$log-server.txt" "server listening" "$bin/ofi-raw" -s -a 127.0.0.1 -p $RAW_PORT "${mode[@]}" -D ||
		{ stop_pid "$server_pid"; server_pid=""; return; }
	timeout -k 5 300 "$bin/ofi-raw" -c 127.0.0.1 -p $RAW_PORT "${mode[@]}" -D -n "${lat_iters[$e]}" \
		-N "$BW_ITERS" -w $WINDOW -r "${read_window[$e]}" >"$log.txt" 2>&1 ||
		echo "  ofi-raw failed: see ${log#"$top"/}.txt" >&2
	finish
	record_table "$e" raw "$log.txt"
}

# print_table ENTRY: its figures' medians, raw and ours, as ratios.
print_table() {
	local e=$1
	awk -v rounds="$ROUNDS" -v entry="$e" -v what="${what[$e]}" -v lat="${lat_iters[$e]}" \
		-v mem="${mem_iters[$e]}" -v bw="$BW_ITERS" "$awk_rounds"'
	function row(what, key, unit, target, d, rawkey,   o, r) {
		o = med("datperf", key); r = med("raw", rawkey == "" ? key : rawkey)
		printf "%-44s %10s %10s %-5s %8s  %s\n", what, f(r, d), f(o, d), unit,
		       (o == "" || r == "" || r == 0) ? "-" : sprintf("%.2fx", o / r), target
	}
	END {
		printf "%-44s %10s %10s %-5s %8s  %s\n", "figure (" what ", polling)", "raw ofi", entry, "unit", "ratio", "target (issue 25)"
		row("RDMA write 8 B one-way, DAT target on memory", "write_lat", "us", "<= 1.3x", 2)
		row("RDMA write 8 B one-way, DAT target polls EVD", "write_lat_evd", "us", "<= 1.3x", 2, "write_lat")
		row("  both sides spin, no yield (raw: write_lat)", "spin_write_lat", "us", "<= 3x (issue 40)", 2, "write_lat")
		row("send 8 B one-way, both sides spin, no yield", "spin_send_lat", "us", "<= 3x (issue 40)", 2, "write_lat")
		row("RDMA read 8 B, median", "read_lat", "us", "<= 1.3x", 2)
		row("RDMA write 1 MiB, 8 in flight", "write_bw", "MB/s", ">= 0.9x", 0)
		row("RDMA read 1 MiB, in flight as datperf", "read_bw", "MB/s", ">= 0.9x", 0)
		row("  the same, DAT target blocked (raw: polls)", "read_bw_blocked", "MB/s", "", 0, "read_bw")
		printf "medians of %d interleaved round(s); latency %d samples (DAT target on memory: %d), bandwidth %d messages\n\n", rounds, lat, mem, bw
	}' "$out/results-$e.txt"
}

start_s=$SECONDS
echo "# bench-ofi: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)," \
	"commit $(git -C "$top" describe --always --dirty 2>/dev/null || echo '?'), entries $ENTRIES" | tee "$out/host.txt"
for r in $(seq "$ROUNDS"); do
	echo "== round $r/$ROUNDS [$((SECONDS - start_s)) s]"
	for e in $ENTRIES; do
		if ((r % 2)); then m_datperf "$e" "$r"; m_raw "$e" "$r"; else m_raw "$e" "$r"; m_datperf "$e" "$r"; fi
	done
done
echo "# after: load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/host.txt"
{
	for e in $ENTRIES; do print_table "$e"; done
	echo "raw ofi = bench/ofi-raw.c (libfabric alone, same provider; FI_EP_RDM entries: ofi-raw -e rdm with"
	echo "our backend's hints); rs-ofi-* = datperf -p over our provider on libfabric. MB/s = 10^6 B/s."
	echo "Timings on a shared 2-CPU host move by tens of percent: read the ratios, taken side by side."
} | tee "$out/table.txt"
echo "(run took $((SECONDS - start_s)) s; raw outputs in ${out#"$top"/})"
