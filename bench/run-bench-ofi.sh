#!/bin/bash
# run-bench-ofi.sh: `make -C bench bench-ofi` (and part of `make bench`).
# datperf over the libfabric entry rs-ofi-tcp ("ofi tcp 127.0.0.1": our
# provider over libfabric's tcp provider, FI_EP_MSG) against ofi-raw, the same
# measurements made with libfabric alone on the same provider, in the same run:
# 8 B RDMA write (one-way, RTT/2) and read latency, 1 MiB RDMA write and read
# bandwidth (8 in flight; reads as many as datperf's IA allows). Both poll
# their completion queues with sched_yield between empty looks (datperf -p,
# ofi-raw's default): like with like. Printed as ratios of raw libfabric
# (issue 25's targets: latency within 1.3x, bandwidth at least 0.9x).
# ROUNDS (default 5) interleaved rounds, the order of the two alternating;
# every figure is the median of the rounds.
#
#   ./run-bench-ofi.sh      ROUNDS=3 LAT_ITERS=5000 ./run-bench-ofi.sh
#   OFI_LIB=/tmp/other-libdaplrs-ofi.so.2 ./run-bench-ofi.sh    (another build, for A/B runs)
#
# Every server runs under `timeout` and is waited for by its ready line;
# raw outputs are kept in build/bench/ofi/.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
# shellcheck source=lib.sh
. "$here/lib.sh"

ROUNDS=${ROUNDS:-5}
LAT_ITERS=${LAT_ITERS:-20000}
BW_ITERS=${BW_ITERS:-2048}
WINDOW=8
DATPERF_QUAL=18617 RAW_PORT=18619
bin=$top/build/bin
out=$top/build/bench/ofi
results=$out/results.txt
conf=$out/dat.conf
mkdir -p "$out"
rm -f "$out"/*.txt
server_pid=""
trap 'stop_pid "$server_pid"' EXIT

for t in datperf ofi-raw; do [ -x "$bin/$t" ] || { echo "error: $bin/$t missing (make -C bench)" >&2; exit 1; }; done
lib=${OFI_LIB:-$top/build/lib/libdaplrs-ofi.so.2}
[ -f "$lib" ] || { echo "error: $lib missing (make at the top)" >&2; exit 1; }
echo "rs-ofi-tcp u2.0 nonthreadsafe default $lib dapl.2.0 \"ofi tcp 127.0.0.1\" \"\"" >"$conf"
ours=(env LD_LIBRARY_PATH="$top/build/lib" DAT_OVERRIDE="$conf")

record() {
	if [ -n "$3" ]; then echo "$1 $2 $3" >>"$results"; else echo "  (no figure for $1 $2)" >&2; fi
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

# The figures of a datperf or ofi-raw table (same columns) as WHO's.
record_table() {
	local who=$1 f=$2
	record "$who" write_lat "$(awk '$1 == "write_lat" && $2 == 8 { print $4 }' "$f")"
	record "$who" read_lat "$(awk '$1 == "read_lat" && $2 == 8 { print $4 }' "$f")"
	record "$who" write_bw "$(awk '$1 == "write_bw" && $2 == 1048576 { print $6 }' "$f")"
	record "$who" read_bw "$(awk '$1 == "read_bw" && $2 == 1048576 { print $6 }' "$f")"
}

read_window=$WINDOW
m_datperf() {
	local r=$1 log=$out/r$1-datperf
	: >"$log.txt"
	# Two connections: the latency tests at 8 B, the bandwidth tests at 1 MiB.
	local part
	for part in "8 write_lat,read_lat -n $LAT_ITERS" "1M write_bw,read_bw -N $BW_ITERS -B 4096"; do
		set -- $part
		start "$log-server.txt" "server listening" "${ours[@]}" "$bin/datperf" -P rs-ofi-tcp -s -q $DATPERF_QUAL \
			-S "$1" -A 60 -p || { stop_pid "$server_pid"; server_pid=""; return; }
		timeout -k 5 300 "${ours[@]}" "$bin/datperf" -P rs-ofi-tcp -h 127.0.0.1 -q $DATPERF_QUAL -S "$1" -w $WINDOW \
			-t "$2" "${@:3}" -p >>"$log.txt" 2>&1 || echo "  datperf round $r failed: see ${log#"$top"/}.txt" >&2
		finish
	done
	# write_lat again with -e: each side's wait on its memory also dequeues its
	# request EVD, as ofi-raw's reads its CQ (libfabric's tcp provider places
	# the peer's data only inside a call of the target: like with like).
	start "$log-server.txt" "server listening" "${ours[@]}" "$bin/datperf" -P rs-ofi-tcp -s -q $DATPERF_QUAL \
		-S 8 -A 60 -p -e || { stop_pid "$server_pid"; server_pid=""; return; }
	timeout -k 5 300 "${ours[@]}" "$bin/datperf" -P rs-ofi-tcp -h 127.0.0.1 -q $DATPERF_QUAL -S 8 -w $WINDOW \
		-t write_lat -n "$LAT_ITERS" -p -e >"$log-e.txt" 2>&1 || echo "  datperf -e round $r failed: see ${log#"$top"/}-e.txt" >&2
	finish
	record datperf write_lat_evd "$(awk '$1 == "write_lat" && $2 == 8 { print $4 }' "$log-e.txt")"
	# ofi-raw keeps as many reads in flight as datperf could.
	local w
	w=$(sed -n 's/.*(RDMA reads \([0-9]*\)).*/\1/p' "$log.txt" | head -1)
	[ -n "$w" ] && read_window=$w
	record_table datperf "$log.txt"
}

m_raw() {
	local r=$1 log=$out/r$1-raw
	start "$log-server.txt" "server listening" "$bin/ofi-raw" -s -a 127.0.0.1 -p $RAW_PORT -D ||
		{ stop_pid "$server_pid"; server_pid=""; return; }
	timeout -k 5 300 "$bin/ofi-raw" -c 127.0.0.1 -p $RAW_PORT -D -n "$LAT_ITERS" -N "$BW_ITERS" -w $WINDOW \
		-r "$read_window" >"$log.txt" 2>&1 || echo "  ofi-raw round $r failed: see ${log#"$top"/}.txt" >&2
	finish
	record_table raw "$log.txt"
}

print_table() {
	awk -v rounds="$ROUNDS" "$awk_rounds"'
	function row(what, key, unit, target, d, rawkey,   o, r) {
		o = med("datperf", key); r = med("raw", rawkey == "" ? key : rawkey)
		printf "%-42s %10s %10s %-5s %8s  %s\n", what, f(r, d), f(o, d), unit,
		       (o == "" || r == "" || r == 0) ? "-" : sprintf("%.2fx", o / r), target
	}
	END {
		printf "%-42s %10s %10s %-5s %8s  %s\n", "figure (ofi tcp, loopback, polling)", "raw ofi", "rs-ofi-tcp", "unit", "ratio", "target (issue 25)"
		row("RDMA write 8 B one-way, DAT target on memory", "write_lat", "us", "<= 1.3x", 2)
		row("RDMA write 8 B one-way, DAT target polls EVD", "write_lat_evd", "us", "<= 1.3x", 2, "write_lat")
		row("RDMA read 8 B, median", "read_lat", "us", "<= 1.3x", 2)
		row("RDMA write 1 MiB, 8 in flight", "write_bw", "MB/s", ">= 0.9x", 0)
		row("RDMA read 1 MiB, in flight as datperf", "read_bw", "MB/s", ">= 0.9x", 0)
		printf "\nmedians of %d interleaved round(s); raw ofi = bench/ofi-raw.c (libfabric alone, same provider);\n", rounds
		print "rs-ofi-tcp = datperf -p over our provider on libfabric. MB/s = 10^6 B/s. Timings on a shared"
		print "2-CPU host move by tens of percent: read the ratios, taken side by side."
	}' "$results"
}

start_s=$SECONDS
echo "# bench-ofi: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)," \
	"commit $(git -C "$top" describe --always --dirty 2>/dev/null || echo '?')" | tee "$out/host.txt"
for r in $(seq "$ROUNDS"); do
	echo "== round $r/$ROUNDS [$((SECONDS - start_s)) s]"
	if ((r % 2)); then m_datperf "$r"; m_raw "$r"; else m_raw "$r"; m_datperf "$r"; fi
done
echo "# after: load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/host.txt"
print_table | tee "$out/table.txt"
echo "(run took $((SECONDS - start_s)) s; raw outputs in ${out#"$top"/})"
