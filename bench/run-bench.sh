#!/bin/bash
# run-bench.sh: datperf over a DAT provider (default our rs-tcp) and qperf's
# TCP figures on the same host, printed as one table.
#
#   ./run-bench.sh                      what `make bench` runs
#   SIZES=8,1M ./run-bench.sh           fewer sizes (datperf -S syntax)
#   IA=ofa-v2-ib0 DAT_OVERRIDE=/etc/dat.conf ./run-bench.sh   another provider
#   DATPERF_ARGS="-n 5000 -w 64" ./run-bench.sh               extra datperf options
#
# Every step is bounded: the servers by their own timeouts and `timeout`,
# readiness by polling for the server's listening line (never a fixed
# sleep). Raw outputs are kept in build/bench/.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
# shellcheck source=lib.sh
. "$here/lib.sh"

IA=${IA:-rs-tcp}
HOST=${HOST:-127.0.0.1}
SIZES=${SIZES:-8-4M}
DATPERF_QUAL=${DATPERF_QUAL:-18515}
QPERF_PORT=${QPERF_PORT:-19765}
QPERF_TIME=${QPERF_TIME:-1}          # seconds per qperf measurement
DATPERF_ARGS=${DATPERF_ARGS:-}
export LD_LIBRARY_PATH=$top/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export DAT_OVERRIDE=${DAT_OVERRIDE:-$top/dat.conf}

datperf=$top/build/bin/datperf
out=$top/build/bench
mkdir -p "$out"
server_pid=""
qperf_pid=""
trap 'stop_pid "$server_pid"; stop_pid "$qperf_pid"' EXIT

# ---------------------------------------------------------------- datperf
run_datperf() {
	echo "== datperf over $IA ($DAT_OVERRIDE), sizes $SIZES"
	# shellcheck disable=SC2086  # DATPERF_ARGS is a list of options
	timeout -k 5 600 "$datperf" -P "$IA" -s -q "$DATPERF_QUAL" -S "$SIZES" -A 30 \
		$DATPERF_ARGS >"$out/datperf-server.log" 2>&1 &
	server_pid=$!
	wait_for_line "$out/datperf-server.log" "server listening" 20 "$server_pid"

	# shellcheck disable=SC2086
	if ! timeout -k 5 600 "$datperf" -P "$IA" -h "$HOST" -q "$DATPERF_QUAL" -S "$SIZES" \
		$DATPERF_ARGS >"$out/datperf.txt" 2>"$out/datperf-client.err"; then
		echo "error: datperf client failed:" >&2
		cat "$out/datperf.txt" "$out/datperf-client.err" >&2
		echo "server:" >&2
		cat "$out/datperf-server.log" >&2
		exit 1
	fi
	if ! wait "$server_pid"; then
		server_pid=""
		echo "error: datperf server failed:" >&2
		cat "$out/datperf-server.log" >&2
		exit 1
	fi
	server_pid=""
	grep -c '_\(lat\|bw\) ' "$out/datperf.txt" | sed 's/$/ datperf measurements/'
}

# ------------------------------------------------------------------ qperf
# Measures tcp_lat and tcp_bw at every size datperf measured, into qperf.txt.
run_qperf() {
	local sizes size

	: >"$out/qperf.txt"
	if ! command -v qperf >/dev/null; then
		echo "warning: qperf not installed (apt-get install -y qperf); no TCP reference" >&2
		return 0
	fi
	echo "== qperf tcp_lat, tcp_bw on 127.0.0.1 (${QPERF_TIME} s each)"
	qperf --listen_port "$QPERF_PORT" >"$out/qperf-server.log" 2>&1 &
	qperf_pid=$!
	wait_for_listen "$QPERF_PORT" 20 "$qperf_pid"

	sizes=$(awk '$1 ~ /_(lat|bw)$/ { print $2 }' "$out/datperf.txt" | sort -nu)
	for size in $sizes; do
		timeout -k 5 60 qperf 127.0.0.1 --listen_port "$QPERF_PORT" -t "$QPERF_TIME" \
			-uu -vu -m "$size" tcp_lat tcp_bw >>"$out/qperf.txt" ||
			{ echo "error: qperf failed at $size bytes" >&2; exit 1; }
	done
	stop_pid "$qperf_pid"
	qperf_pid=""
}

# ------------------------------------------------------------------ table
# Joins datperf's rows (test bytes iters median p99 MB/s) with qperf's
# verbose blocks (latency in ns, bw in bytes/sec thanks to -uu).
print_table() {
	awk '
	function scale(unit) {          # to us, or to MB/s
		if (unit == "ns") return 1e-3; if (unit == "us") return 1; if (unit == "ms") return 1e3
		if (unit == "sec") return 1e6
		if (unit == "bytes/sec") return 1e-6; if (unit == "KB/sec") return 1e-3
		if (unit == "MB/sec") return 1; if (unit == "GB/sec") return 1e3
		return 0
	}
	function f(x, d) { return x == "" ? "-" : sprintf("%." d "f", x) }
	FNR == 1 { file++ }
	file == 1 && $1 ~ /_(lat|bw)$/ {
		split($1, t, "_"); op = t[1]; sz = $2
		if (t[2] == "lat") { med[op, sz] = $4; p99[op, sz] = $5 } else bw[op, sz] = $6
		if (!(sz in seen)) { seen[sz] = 1; order[n++] = sz }
	}
	file == 2 && /^tcp_(lat|bw):/ { test = $1 }
	file == 2 && $1 == "latency" { v = $3 * scale($4) }
	file == 2 && $1 == "bw" { v = $3 * scale($4) }
	file == 2 && $1 == "msg_size" {
		if (test == "tcp_lat:") qlat[$3] = v; else qbw[$3] = v
	}
	END {
		printf "\n%-9s %-6s %11s %11s %10s | %13s %13s\n", "bytes", "op",
		       "median_us", "p99_us", "MB/s", "qperf lat_us", "qperf MB/s"
		for (i = 0; i < n; i++) {
			sz = order[i]
			split("send write read", ops, " ")
			for (k = 1; k <= 3; k++) {
				op = ops[k]
				if (!((op, sz) in med) && !((op, sz) in bw)) continue
				ql = (k == 1) ? f(qlat[sz], 2) : ""; qb = (k == 1) ? f(qbw[sz], 1) : ""
				printf "%-9s %-6s %11s %11s %10s | %13s %13s\n", sz, op,
				       f(med[op, sz], 2), f(p99[op, sz], 2), f(bw[op, sz], 1), ql, qb
			}
		}
		print "\nlatency: send/write one-way (RTT/2, as perftest); read = one whole RDMA read."
		print "qperf tcp_lat is one-way; MB/s = 10^6 bytes/s.\n"
		if ((("read", 8) in med) && qlat[8] > 0)
			printf "8 B RDMA read latency / qperf tcp_lat:      %.2f / %.2f us = %.1fx" \
			       " (a read is a round trip: parity is 2x)\n",
			       med["read", 8], qlat[8], med["read", 8] / qlat[8]
		else print "8 B RDMA read latency / qperf tcp_lat: n/a"
		if ((("read", 1048576) in bw) && qbw[1048576] > 0)
			printf "1 MiB RDMA read bandwidth / qperf tcp_bw:  %.1f / %.1f MB/s = %.2f\n",
			       bw["read", 1048576], qbw[1048576], bw["read", 1048576] / qbw[1048576]
		else print "1 MiB RDMA read bandwidth / qperf tcp_bw: n/a"
	}' "$out/datperf.txt" "$out/qperf.txt"
}

# Provenance for whoever quotes the figures: a busy host skews them.
host_line() {
	echo "# $1: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)," \
		"commit $(git -C "$top" describe --always --dirty 2>/dev/null || echo '?')"
}

start=$SECONDS
host_line "before" | tee "$out/host.txt"
run_datperf
run_qperf
print_table | tee "$out/table.txt"
host_line "after" | tee -a "$out/host.txt"
echo "(run took $((SECONDS - start)) s; raw outputs in ${out#"$top"/})"
