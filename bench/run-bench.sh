#!/bin/bash
# run-bench.sh: what `make bench` runs. One table, from one run, of
#   - the references: a busy-polled TCP round trip (tcprtt), qperf tcp_bw at
#     1 MiB, and the same-host limit process_vm_readv (pvmread);
#   - datperf over rs-tcp, polling (dat_evd_dequeue) and blocking
#     (dat_evd_wait) consumers: 8 B RDMA read/send/write latency, 1 MiB RDMA
#     read bandwidth with 8 reads in flight;
#   - Debian's dapltest -T P -m p / -m b RR 8 (and -m b -p 8 RR 1 MiB) over rs-tcp;
#   - per-message registration rounds (datperf reg_write / reg_read, 4 KiB and 1 MiB) and
#     the cost of dat_lmr_create / dat_lmr_free, on the same host also with arenas off;
#   - 8 B RDMA write and send ping-pongs whose two sides spin on their memory (datperf -y
#     spin), over TCP also with real-time progress threads;
# each in three settings: "veth", two network namespaces joined by a veth
# pair, each side also in its own PID namespace (so no cross-memory attach can
# reach the peer: TCP carries everything); "lo", plain loopback with the
# same-host path turned off (DAPLRS_SAME_HOST=never: TCP over loopback); and
# "host", the same two processes on one host with the same-host path required
# (DAPLRS_SAME_HOST=require; its reference is process_vm_readv). Our figures
# are printed as ratios of the reference measured in the same setting.
# ROUNDS (default 3) interleaved rounds; every figure is the median of the
# rounds.
#
# MEASURES (default all) picks some: "ref" (tcprtt, qperf, pvmread), "datperf", "reg",
# "spin", "dapltest"; SPIN_VARIANTS (default "normal realtime signal") the spinning rows'.
#
#   ./run-bench.sh                 ROUNDS=1 ./run-bench.sh    SETTINGS="lo host" ./run-bench.sh
#   MEASURES="ref spin" SETTINGS="lo veth" ./run-bench.sh
#
# Needs root (namespaces), qperf, dapltest (dapl2-utils), iproute2: the top
# Makefile's bench target installs them. Every server runs under `timeout`
# and is waited for by its ready line or its listening socket, never by a
# fixed sleep; raw outputs are kept in build/bench/.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
# shellcheck source=lib.sh
. "$here/lib.sh"

ROUNDS=${ROUNDS:-3}
SETTINGS=${SETTINGS:-veth lo host}
MEASURES=${MEASURES:-ref datperf reg spin dapltest}
SPIN_VARIANTS=${SPIN_VARIANTS:-normal realtime signal}
LAT_ITERS=${LAT_ITERS:-20000}
REG_ITERS=${REG_ITERS:-1000}
SPIN_ITERS=${SPIN_ITERS:-1000}
DT_ITERS=${DT_ITERS:-20000}
QPERF_TIME=${QPERF_TIME:-2}
DATPERF_QUAL=18615 TCPRTT_PORT=19866 QPERF_PORT=19865
bin=$top/build/bin
out=$top/build/bench
raw=$out/raw
results=$out/results.txt
mkdir -p "$raw"
rm -f "$raw"/* "$results"
ns_a=bnch-a ns_b=bnch-b
addr_a=192.0.2.1 addr_b=192.0.2.2
server_pid=""

cleanup() {
	stop_pid "$server_pid"
	ip netns del $ns_a 2>/dev/null
	ip netns del $ns_b 2>/dev/null
}
trap cleanup EXIT

setup_ns() {
	cleanup
	ip netns add $ns_a && ip netns add $ns_b || { echo "error: cannot create network namespaces (root?)" >&2; exit 1; }
	ip link add veth-$ns_a netns $ns_a type veth peer name veth-$ns_b netns $ns_b
	ip -n $ns_a addr add $addr_a/24 dev veth-$ns_a
	ip -n $ns_b addr add $addr_b/24 dev veth-$ns_b
	for ns in $ns_a $ns_b; do
		ip -n $ns link set lo up
		ip -n $ns link set veth-$ns up
		for ts in nonthreadsafe threadsafe; do
			echo "rs-tcp u2.0 $ts default libdaplrs.so.2 dapl.2.0 \"tcp veth-$ns\" \"\""
		done >"$out/dat.conf.$ns"
	done
}

# run SETTING SIDE CMD...: CMD as side a (server) or b (client) of SETTING.
# veth: in the side's network namespace and in a PID namespace of its own.
# Always run inside `bash -c` under `timeout`: it execs, so that stopping the
# timeout stops the server itself (unshare --kill-child passes it on).
run() {
	local setting=$1 side=$2
	shift 2
	if [ "$setting" = veth ]; then
		local ns=bnch-$side
		exec ip netns exec $ns unshare --pid --fork --kill-child \
			env LD_LIBRARY_PATH="$top/build/lib" DAT_OVERRIDE="$out/dat.conf.$ns" "$@"
	elif [ "$setting" = host ]; then
		exec env DAPLRS_SAME_HOST=require LD_LIBRARY_PATH="$top/build/lib" DAT_OVERRIDE="$top/dat.conf" "$@"
	else
		exec env DAPLRS_SAME_HOST=never LD_LIBRARY_PATH="$top/build/lib" DAT_OVERRIDE="$top/dat.conf" "$@"
	fi
}

export -f run
export top out

server_addr() { if [ "$1" = veth ]; then echo $addr_a; else echo 127.0.0.1; fi; }

# start_server SETTING LOG READY_REGEX CMD...: side a, bounded by timeout,
# ready when LOG shows READY_REGEX.
start_server() {
	local setting=$1 log=$2 re=$3
	shift 3
	timeout -k 5 300 bash -c 'run "$@"' \
		_ "$setting" a "$@" >"$log" 2>&1 &
	server_pid=$!
	wait_for_line "$log" "$re" 30 "$server_pid"
}

# qperf prints nothing when ready: poll its listening socket in its namespace.
start_qperf() {
	local setting=$1 log=$2 deadline=$((SECONDS + 30))
	local hex
	hex=$(printf ':%04X' $QPERF_PORT)
	timeout -k 5 300 bash -c 'run "$@"' \
		_ "$setting" a qperf --listen_port $QPERF_PORT >"$log" 2>&1 &
	server_pid=$!
	local netns=()
	[ "$setting" = veth ] && netns=(ip netns exec $ns_a)
	until "${netns[@]}" awk -v p="$hex" '$2 ~ p"$" && $4 == "0A" { f = 1 } END { exit !f }' \
		/proc/net/tcp /proc/net/tcp6 2>/dev/null; do
		kill -0 "$server_pid" 2>/dev/null || { echo "error: qperf server exited" >&2; return 1; }
		((SECONDS < deadline)) || { echo "error: qperf does not listen after 30 s" >&2; return 1; }
		sleep 0.05
	done
}

stop_server() { stop_pid "$server_pid"; server_pid=""; }

# record SETTING KEY VALUE: one figure of one round.
record() {
	if [ -n "$3" ]; then echo "$1 $2 $3" >>"$results"; else echo "  (no figure for $1 $2)" >&2; fi
}

# ------------------------------------------------------------ the measurements
m_tcprtt() {
	local s=$1 r=$2 log=$raw/$1-r$2-tcprtt
	start_server "$s" "$log-server.txt" "listening" "$bin/tcprtt" -s -p $TCPRTT_PORT -T 60 || { stop_server; return; }
	timeout -k 5 120 bash -c 'run "$@"' _ "$s" b \
		"$bin/tcprtt" -c "$(server_addr "$s")" -p $TCPRTT_PORT -n "$LAT_ITERS" -w 1000 >"$log.txt" 2>&1
	stop_server
	record "$s" rtt_med "$(awk '/median_us/ { for (i = 1; i < NF; i++) if ($i == "median_us") print $(i + 1) }' "$log.txt")"
	record "$s" rtt_p99 "$(awk '/p99_us/ { for (i = 1; i < NF; i++) if ($i == "p99_us") print $(i + 1) }' "$log.txt")"
}

m_qperf() {
	local s=$1 r=$2 log=$raw/$1-r$2-qperf
	start_qperf "$s" "$log-server.txt" || { stop_server; return; }
	timeout -k 5 120 bash -c 'run "$@"' _ "$s" b \
		qperf "$(server_addr "$s")" --listen_port $QPERF_PORT -t "$QPERF_TIME" -uu -m 1048576 tcp_bw >"$log.txt" 2>&1
	stop_server
	# -uu: "bw = <n> bytes/sec" (or another unit on old versions): to MB/s (10^6).
	record "$s" tcpbw "$(awk '$1 == "bw" { u = $4; v = $3
		m = (u == "bytes/sec") ? 1e-6 : (u == "KB/sec") ? 1e-3 : (u == "MB/sec") ? 1 : (u == "GB/sec") ? 1e3 : 0
		if (m) printf "%.1f\n", v * m }' "$log.txt")"
}

# datperf MODE (poll|block): 8 B and 1 MiB, latency tests and read_bw, 8 reads in flight;
# 2,000 x 1 MiB per bandwidth point (-B 2048: about as long as qperf's 2 s on veth, where
# datperf's default 256 MiB lasted a tenth of it and caught a different moment of veth's rate).
m_datperf() {
	local s=$1 r=$2 mode=$3 log=$raw/$1-r$2-datperf-$3 p=()
	[ "$mode" = poll ] && p=(-p)
	start_server "$s" "$log-server.txt" "server listening" "$bin/datperf" -P rs-tcp -s -q $DATPERF_QUAL \
		-S 8,1M -A 60 "${p[@]}" || { stop_server; return; }
	timeout -k 5 300 bash -c 'run "$@"' _ "$s" b \
		"$bin/datperf" -P rs-tcp -h "$(server_addr "$s")" -q $DATPERF_QUAL -S 8,1M -w 8 -B 2048 \
		-t read_lat,send_lat,write_lat,read_bw,send_bw -n "$LAT_ITERS" "${p[@]}" >"$log.txt" 2>&1 ||
		echo "  datperf $s $mode failed: see ${log#"$top"/}.txt" >&2
	wait "$server_pid" 2>/dev/null
	server_pid=""
	local t
	for t in read send write; do
		record "$s" "${t}_${mode}_med" "$(awk -v t=${t}_lat '$1 == t && $2 == 8 { print $4 }' "$log.txt")"
		record "$s" "${t}_${mode}_p99" "$(awk -v t=${t}_lat '$1 == t && $2 == 8 { print $5 }' "$log.txt")"
	done
	record "$s" "readbw_$mode" "$(awk '$1 == "read_bw" && $2 == 1048576 { print $6 }' "$log.txt")"
	record "$s" "sendbw_$mode" "$(awk '$1 == "send_bw" && $2 == 1048576 { print $6 }' "$log.txt")"
}

# Per-message registration (issue 26): datperf reg_write / reg_read at 4 KiB and 1 MiB,
# polling: a rendezvous message as a message layer without a registration cache moves it
# (both sides register the same buffer anew, one RDMA write or read, a finish message, both
# free). Figures: the median round, and the initiator's dat_lmr_create / dat_lmr_free in the
# write test. VARIANT nomap: the same with arenas off (DAPLRS_SAME_HOST_MAP=never).
m_reg() {
	local s=$1 r=$2 variant=${3:-} log=$raw/$1-r$2-reg${3:+-$3} env=() p=${3:+${3}_}
	[ "$variant" = nomap ] && env=(env DAPLRS_SAME_HOST_MAP=never)
	start_server "$s" "$log-server.txt" "server listening" "${env[@]}" "$bin/datperf" -P rs-tcp -s \
		-q $DATPERF_QUAL -S 4K,1M -A 60 -p || { stop_server; return; }
	timeout -k 5 300 bash -c 'run "$@"' _ "$s" b "${env[@]}" \
		"$bin/datperf" -P rs-tcp -h "$(server_addr "$s")" -q $DATPERF_QUAL -S 4K,1M -t reg \
		-n "$REG_ITERS" -p >"$log.txt" 2>&1 ||
		echo "  datperf reg $s ${variant:-} failed: see ${log#"$top"/}.txt" >&2
	wait "$server_pid" 2>/dev/null
	server_pid=""
	local t z k
	for z in 4096 1048576; do
		k=$([ $z = 4096 ] && echo 4k || echo 1m)
		for t in write read; do
			record "$s" "${p}reg_${t}_$k" "$(awk -v t=reg_$t -v z=$z '$1 == t && $2 == z { print $4 }' "$log.txt")"
		done
		record "$s" "${p}create_$k" "$(awk -v z=$z '$1 == "reg_write:create" && $2 == z { print $4 }' "$log.txt")"
		record "$s" "${p}free_$k" "$(awk -v z=$z '$1 == "reg_write:free" && $2 == z { print $4 }' "$log.txt")"
	done
}

# Spinning waiters (issue 22): datperf -p -y spin, 8 B RDMA write and send ping-pong, both
# sides spinning on their buffers' last byte with no DAT call and no sched_yield (and
# reaping with a dequeue loop without yield), both processes' threads competing for the
# machine's CPUs; and 8 B RDMA reads of a target that spins on its memory meanwhile. One-way (RTT/2) median and p99. VARIANT realtime: progress threads
# SCHED_FIFO (DAPLRS_PROGRESS_PRIORITY=realtime); signal: the kernel interrupts the spinning
# thread and a signal handler places the data (DAPLRS_TARGET_SIGNAL=on).
m_spin() {
	local s=$1 r=$2 variant=${3:-} log=$raw/$1-r$2-spin${3:+-$3} env=() p=${3:+${3}_} n=$SPIN_ITERS
	[ "$variant" = realtime ] && env=(env DAPLRS_PROGRESS_PRIORITY=realtime)
	[ "$variant" = signal ] && env=(env DAPLRS_TARGET_SIGNAL=on)
	# Over TCP an ordinary progress thread takes milliseconds a message here: fewer of them.
	[ "$s" = host ] && n=$LAT_ITERS
	start_server "$s" "$log-server.txt" "server listening" "${env[@]}" "$bin/datperf" -P rs-tcp -s \
		-q $DATPERF_QUAL -S 8 -A 60 -p -y spin || { stop_server; return; }
	timeout -k 5 300 bash -c 'run "$@"' _ "$s" b "${env[@]}" \
		"$bin/datperf" -P rs-tcp -h "$(server_addr "$s")" -q $DATPERF_QUAL -S 8 -t write_lat,send_lat,read_lat \
		-n "$n" -p -y spin >"$log.txt" 2>&1 ||
		echo "  datperf spin $s ${variant:-} failed: see ${log#"$top"/}.txt" >&2
	wait "$server_pid" 2>/dev/null
	server_pid=""
	local t
	for t in write send read; do
		record "$s" "${p}spin_${t}_med" "$(awk -v t=${t}_lat '$1 == t && $2 == 8 { print $4 }' "$log.txt")"
		record "$s" "${p}spin_${t}_p99" "$(awk -v t=${t}_lat '$1 == t && $2 == 8 { print $5 }' "$log.txt")"
	done
}

# What a signal costs here (bench/sigdelay.c, loopback, no DAT): 8 B to a process that reads
# it by busy recv, and to one spinning on memory whose signal handler reads it. A spinning
# ping-pong served by signals pays at least one of each per round (the side that answers
# from inside its DAT calls reads its socket itself): the floor of the signal rows.
m_sigdelay() {
	local r=$1 log=$raw/r$1-sigdelay m
	for m in 0 1; do
		DAPLRS_SAME_HOST=never timeout -k 5 120 "$bin/sigdelay" $m "$SPIN_ITERS" >"$log-$m.txt" 2>&1
		record lo "sigdelay${m}_med" "$(awk '{ for (i = 1; i < NF; i++) if ($i == "median_us") print $(i + 1) }' "$log-$m.txt")"
	done
}

# Debian's dapltest -T P (the issue's command lines), one server per setting and round.
# Its latency figure comes from its second phase, one read at a time, the
# completion always reaped by a dat_evd_dequeue loop with a sched_yield between
# tries, whatever -m says (dapl_performance_client.c); -m b|p only selects how
# the first, pipelined phase (ops/s, MB/s) waits. It prints a mean, no median.
m_dapltest() {
	local s=$1 r=$2 log=$raw/$1-r$2-dapltest addr
	addr=$(server_addr "$s")
	start_server "$s" "$log-server.txt" "Service Point Ready" dapltest -T S -D rs-tcp || { stop_server; return; }
	local m
	for m in p b; do
		timeout -k 5 120 bash -c 'run "$@"' _ "$s" b \
			dapltest -T P -s "$addr" -D rs-tcp -i "$DT_ITERS" -m $m RR 8 1 >"$log-$m-RR8.txt" 2>&1
		# raw: OP, ops, size, segs, pipeline, cpu%, ops/s, MiB/s, latency mean us, ...
		record "$s" "dt_${m}_lat" "$(awk -F', *' '/^raw:/ { print $9 + 0 }' "$log-$m-RR8.txt")"
	done
	timeout -k 5 120 bash -c 'run "$@"' _ "$s" b \
		dapltest -T P -s "$addr" -D rs-tcp -i 500 -m b -p 8 RR 1048576 1 >"$log-b-RR1M.txt" 2>&1
	record "$s" dt_bw "$(awk -F', *' '/^raw:/ { printf "%.1f\n", $8 * 1.048576 }' "$log-b-RR1M.txt")"
	timeout -k 5 30 bash -c 'run "$@"' _ "$s" b \
		dapltest -T Q -s "$addr" -D rs-tcp >"$log-quit.txt" 2>&1
	wait "$server_pid" 2>/dev/null
	server_pid=""
}

m_pvm() {
	"$bin/pvmread" >"$raw/r$1-pvmread.txt" 2>&1
	record host pvm_med "$(awk '/8 B:/ { for (i = 1; i < NF; i++) if ($i == "median_us") print $(i + 1) }' "$raw/r$1-pvmread.txt")"
	record host pvm_bw "$(awk '/1 MiB:/ { print $NF }' "$raw/r$1-pvmread.txt")"
}

host_line() {
	echo "# $1: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)," \
		"commit $(git -C "$top" describe --always --dirty 2>/dev/null || echo '?')"
}

# ------------------------------------------------------------------ the table
print_table() {
	awk -v rounds="$ROUNDS" "$awk_rounds"'
	function ratio(x, y) { return (x == "" || y == "" || y == 0) ? "-" : sprintf("%.2fx", x / y) }
	function row(what, s, val, unit, refv, refname, target, d) {
		printf "%-50s %-5s %10s %-5s %8s  %-12s %s\n", what, s, f(val, d), unit, ratio(val, refv), refname, target
	}
	# The per-message registration rows of setting s (prefix p: "" or "nomap_"), as ratios of
	# the same figure over TCP on loopback (issue 26: the same-host path never slower).
	function reg_rows(s, p, label,   z, k, t, tgt, op) {
		tgt = s == "host" ? "<= 1x" : ""
		for (z = 1; z <= 2; z++) {
			k = z == 1 ? "4k" : "1m"
			for (t = 1; t <= 2; t++) {
				op = t == 1 ? "write" : "read"
				row("  reg " label op " " (z == 1 ? "4 KiB" : "1 MiB") " round, median", s, med(s, p "reg_" op "_" k), "us",
				    s == "lo" ? "" : med("lo", "reg_" op "_" k), s == "lo" ? "" : "lo (TCP)", tgt, 1)
			}
			row("  reg " label "dat_lmr_create " (z == 1 ? "4 KiB" : "1 MiB") ", median", s, med(s, p "create_" k), "us", "", "", "", 2)
			row("  reg " label "dat_lmr_free " (z == 1 ? "4 KiB" : "1 MiB") ", median", s, med(s, p "free_" k), "us", "", "", "", 2)
		}
	}
	# The spinning waiters rows of setting s (prefix p: "", "realtime_" or "signal_"), as ratios of the
	# setting'"'"'s busy-polled round trip (issue 22: a one-way within it over TCP; 2 us on the
	# same host).
	function spin_rows(s, p, label, rtt,   t, op, tgt) {
		for (t = 1; t <= 2; t++) {
			op = t == 1 ? "write" : "send"
			tgt = s == "host" ? "<= 2 us" : "<= 1x"
			row("  spin " label op " 8 B one-way (RTT/2) median", s, med(s, p "spin_" op "_med"), "us",
			    rtt, rtt == "" ? "" : "TCP RTT", tgt, 2)
			row("  spin " label op " 8 B one-way p99", s, med(s, p "spin_" op "_p99"), "us", "", "", "", 2)
		}
		row("  spin " label "read 8 B, whole read, median", s, med(s, p "spin_read_med"), "us",
		    rtt, rtt == "" ? "" : "TCP RTT", "", 2)
	}
	END {
		printf "%-50s %-5s %10s %-5s %8s  %-12s %s\n", "figure", "where", "value", "unit", "ratio", "of reference", "target (issues 10, 22, 26)"
		split(SETTINGS, S, " ")
		pm = med("host", "pvm_med"); pb = med("host", "pvm_bw")
		for (i = 1; i in S; i++) {
			s = S[i]
			if (s == "host") {
				print "---- host: same host, same-host path required (cross-memory attach) ----"
				row("  ref: process_vm_readv 8 B, median", s, pm, "us", "", "", "", 2)
				row("  ref: process_vm_readv 1 MiB", s, pb, "MB/s", "", "", "", 0)
				for (mi = 1; mi <= 2; mi++) {
					mo = mi == 1 ? "poll" : "block"; m = med(s, "read_" mo "_med")
					row("  datperf " mo " read 8 B median", s, m, "us", "", "", mi == 1 ? "<= 1.5 us" : "", 2)
					row("  datperf " mo " read 8 B p99", s, med(s, "read_" mo "_p99"), "us", m, "its median", "", 2)
					row("  datperf " mo " send 8 B one-way (RTT/2) median", s, med(s, "send_" mo "_med"), "us", "", "", "", 2)
					row("  datperf " mo " write 8 B one-way (RTT/2) median", s, med(s, "write_" mo "_med"), "us", "", "", "", 2)
					row("  datperf " mo " read 1 MiB, 8 in flight", s, med(s, "readbw_" mo), "MB/s", pb, "pvm_readv", ">= 0.8x", 0)
					row("  datperf " mo " send 1 MiB, 8 in flight", s, med(s, "sendbw_" mo), "MB/s", pb, "pvm_readv", "", 0)
				}
				row("  dapltest -T P -m p RR 8, latency phase (mean)", s, med(s, "dt_p_lat"), "us", "", "", "", 2)
				row("  dapltest -T P -m b RR 8, latency phase (mean)", s, med(s, "dt_b_lat"), "us", "", "", "", 2)
				row("  dapltest -T P -m b -p 8 RR 1 MiB", s, med(s, "dt_bw"), "MB/s", pb, "pvm_readv", "", 0)
				reg_rows(s, "", "")
				reg_rows(s, "nomap_", "(arenas off) ")
				spin_rows(s, "", "", "")
				continue
			}
			rtt = med(s, "rtt_med"); bw = med(s, "tcpbw")
			printf "---- %s ----\n", (s == "veth" ? "veth: two netns + PID namespaces, rs-tcp over veth" : "lo: loopback, one namespace, same-host path off (TCP)")
			row("  ref: TCP round trip 8 B busy-polled, median", s, rtt, "us", "", "", "", 2)
			row("  ref: TCP round trip 8 B busy-polled, p99", s, med(s, "rtt_p99"), "us", "", "", "", 2)
			row("  ref: qperf tcp_bw 1 MiB", s, bw, "MB/s", "", "", "", 0)
			for (mi = 1; mi <= 2; mi++) {
				mo = mi == 1 ? "poll" : "block"; tgt = mi == 1 ? "<= 1.5x" : "<= 2.5x"
				m = med(s, "read_" mo "_med")
				row("  datperf " mo " read 8 B median", s, m, "us", rtt, "TCP RTT", tgt, 2)
				row("  datperf " mo " read 8 B p99", s, med(s, "read_" mo "_p99"), "us", m, "its median", "<= 3x", 2)
				row("  datperf " mo " send 8 B one-way (RTT/2) median", s, med(s, "send_" mo "_med"), "us", rtt, "TCP RTT", "", 2)
				row("  datperf " mo " write 8 B one-way (RTT/2) median", s, med(s, "write_" mo "_med"), "us", rtt, "TCP RTT", "", 2)
				row("  datperf " mo " read 1 MiB, 8 in flight", s, med(s, "readbw_" mo), "MB/s", bw, "tcp_bw", ">= 0.95x", 0)
				row("  datperf " mo " send 1 MiB, 8 in flight", s, med(s, "sendbw_" mo), "MB/s", bw, "tcp_bw", "", 0)
			}
			row("  dapltest -T P -m p RR 8, latency phase (mean)", s, med(s, "dt_p_lat"), "us", rtt, "TCP RTT", "<= 1.5x", 2)
			row("  dapltest -T P -m b RR 8, latency phase (mean)", s, med(s, "dt_b_lat"), "us", rtt, "TCP RTT", "<= 2.5x", 2)
			row("  dapltest -T P -m b -p 8 RR 1 MiB", s, med(s, "dt_bw"), "MB/s", bw, "tcp_bw", ">= 0.95x", 0)
			reg_rows(s, "", "")
			spin_rows(s, "", "", rtt)
			spin_rows(s, "realtime_", "(realtime) ", rtt)
			spin_rows(s, "signal_", "(signal) ", rtt)
			if (s == "lo") {
				sb = med(s, "sigdelay0_med"); ss = med(s, "sigdelay1_med")
				row("  ref: sigdelay 0: 8 B to a busy recv, one-way", s, sb, "us", rtt, "TCP RTT", "", 2)
				row("  ref: sigdelay 1: 8 B to a spinner, by signal", s, ss, "us", rtt, "TCP RTT", "", 2)
				row("  ref: signal rows floor, (sigdelay 0 + 1) / 2", s, (sb == "" || ss == "") ? "" : (sb + ss) / 2, "us", rtt, "TCP RTT", "", 2)
			}
		}
		printf "\nmedians of %d interleaved round(s); MB/s = 10^6 B/s; latency of a read = the whole read,\n", rounds
		print "send/write = one-way (RTT/2, as perftest). dapltest latency: its one-read-at-a-time phase, reaped"
		print "by dat_evd_dequeue + sched_yield in both -m modes, a mean (it prints no median). reg: a round"
		print "registers on both sides, moves the data once, sends a finish and frees (datperf reg_*, polled)."
		print "spin: both sides spin on their buffers, no DAT call, no sched_yield (datperf -p -y spin; a read:"
		print "its target spins meanwhile); realtime:"
		print "progress threads SCHED_FIFO (DAPLRS_PROGRESS_PRIORITY=realtime); signal: a signal handler"
		print "places the data (DAPLRS_TARGET_SIGNAL=on). sigdelay: raw C over loopback, what a signal costs a"
		print "message here; a signal-served spinning round pays one signal and one busy recv at least."
		print "Timings on a shared 2-CPU host move by tens of percent: read the ratios, taken side by side."
	}' SETTINGS="$SETTINGS" "$results"
}

# -------------------------------------------------------------------- the run
measures() { case " $MEASURES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
for t in datperf tcprtt pvmread sigdelay; do [ -x "$bin/$t" ] || { echo "error: $bin/$t missing (make -C bench)" >&2; exit 1; }; done
need=(ip unshare)
measures ref && need+=(qperf)
measures dapltest && need+=(dapltest)
for t in "${need[@]}"; do command -v $t >/dev/null || { echo "error: $t not installed (make bench installs it)" >&2; exit 1; }; done
start=$SECONDS
host_line before | tee "$out/host.txt"
case " $SETTINGS " in *" veth "*) setup_ns ;; esac
for r in $(seq "$ROUNDS"); do
	for s in $SETTINGS; do
		echo "== round $r/$ROUNDS, $s [$((SECONDS - start)) s]"
		if measures ref; then
			if [ "$s" = host ]; then
				m_pvm "$r"
			else
				m_tcprtt "$s" "$r"
				m_qperf "$s" "$r"
			fi
		fi
		if measures datperf; then
			m_datperf "$s" "$r" poll
			m_datperf "$s" "$r" block
		fi
		if measures reg; then
			m_reg "$s" "$r"
			[ "$s" = host ] && m_reg "$s" "$r" nomap
		fi
		if measures spin; then
			case " $SETTINGS " in *" lo "*) [ "$s" = lo ] && m_sigdelay "$r" ;; esac
			for v in $SPIN_VARIANTS; do
				if [ "$v" = normal ]; then m_spin "$s" "$r"; else [ "$s" = host ] || m_spin "$s" "$r" "$v"; fi
			done
		fi
		measures dapltest && m_dapltest "$s" "$r"
	done
	case " $SETTINGS " in *" host "*) ;; *) measures ref && m_pvm "$r" ;; esac
done
host_line after | tee -a "$out/host.txt"
print_table | tee "$out/table.txt"
echo "(run took $((SECONDS - start)) s; raw outputs in ${out#"$top"/}/raw, figures per round in ${results#"$top"/})"
