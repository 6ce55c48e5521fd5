#!/bin/bash
# run-bench-guest.sh: the soft-RoCE section of `make bench`. Boots ONE
# throw-away qemu guest (scripts/rxe-vm: rxe0 on netdev rxenet0 =
# 192.0.2.1/24, port 1, GID index 1) and, in it, measures
#
#   8 B RDMA read latency and 1 MiB RDMA read bandwidth
#
# three ways, interleaved in rounds (each round: ours, OFED's, raw verbs for
# the latency, then the same for the bandwidth) so that drift hits all
# alike; the median of the rounds is kept:
#
#   ours     datperf over rs-rxe0      (libdat2 + libdaplrs-verbs.so.2)
#   OFED's   datperf over ofa-v2-rxe   (the same datperf and libdat2 with
#                                       OFED's libdaplofa.so.2)
#   raw      perftest ib_read_lat / ib_read_bw on rxe0 (verbs, no DAT)
#
# and registration per message (issue 26): datperf reg_write / reg_read
# rounds at 4 KiB and 1 MiB (ours and OFED's), and regcost's
# dat_lmr_create / dat_lmr_free (ours, OFED's) against raw ibv_reg_mr /
# ibv_dereg_mr of the same buffer; connections at scale (issue 37): bench/
# datscale at N = 1, 64, 256 (SCALE_NS) over ours and OFED's, the same EP
# attributes (queues 4/4, one request, one receive and one connection EVD
# shared by every EP): the 8 B send/recv round trip on EP 0, connections set
# up per second, and the RSS growth per connection of client and server
# (smaps_rollup; at N = 1 it holds one-time costs too); then, in the same
# guest, the CPU cost of
# each DTO on the verbs path with message and connection rates
# (bench/dto-cost.sh, its own table; 30-45 minutes; BENCH_COST=0 skips it).
#
# The guest runs under TCG emulation here, so its absolute figures mean
# nothing; the ratios ours:OFED and ours:raw are the result.
#
#   ./run-bench-guest.sh                   what `make bench` runs after the host section
#   ROUNDS=7 LAT_ITERS=2000 ./run-bench-guest.sh
#   DATPERF_ARGS=-p ./run-bench-guest.sh   datperf busy-polls (perftest always polls)
#
# Env: ROUNDS (5), LAT_ITERS (1000, 8 B reads per latency run), BW_ITERS
#      (200, 1 MiB reads per bandwidth run), STEP_TIMEOUT (120 s per client),
#      GUEST_VM_TIMEOUT (900 s for the whole guest, boot included, 4500 with
#      the cost section; the latency/bandwidth measurements take 300-400 s),
#      DATPERF_ARGS (extra datperf options, both sides), SCALE_NS ("1 64 256";
#      empty: no datscale rows), SCALE_ITERS (1000 round trips, at most 5 s).
# Every server is bounded by `timeout`, waited for by polling (its listening
# line, or its TCP port for perftest), never by a fixed sleep, and killed on
# exit. Logs of every run, per-round figures and the table are kept in
# build/bench/guest/. Exit status: 0 when every measurement succeeded.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
out=$top/build/bench/guest
# shellcheck source=guest-lib.sh
. "$here/guest-lib.sh"
ROUNDS=${ROUNDS:-5}
LAT_ITERS=${LAT_ITERS:-1000}
BW_ITERS=${BW_ITERS:-200}
REG_ITERS=${REG_ITERS:-200}
SCALE_NS=${SCALE_NS-1 64 256}
SCALE_ITERS=${SCALE_ITERS:-1000}
STEP_TIMEOUT=${STEP_TIMEOUT:-120}
DATPERF_ARGS=${DATPERF_ARGS:-}
DATPERF_QUAL=18515      # rdma_cm port space
PERFTEST_PORT=18516     # TCP, perftest's out-of-band exchange
SCALE_QUAL=18517        # datscale, rdma_cm port space
export ROUNDS LAT_ITERS BW_ITERS REG_ITERS STEP_TIMEOUT DATPERF_ARGS SCALE_NS SCALE_ITERS

# ================================================================ host side
if [ "${1:-}" != --inside ]; then
	install_guest_debs run-bench-guest || exit 1
	for f in build/lib/libdat2.so.2 build/lib/libdaplrs-verbs.so.2 build/bin/datperf build/bin/regcost build/bin/datscale; do
		if [ ! -e "$top/$f" ]; then
			echo "run-bench-guest: $f is missing (run make, then make -C bench)" >&2
			exit 1
		fi
	done
	rm -rf "$out"
	mkdir -p "$out"
	echo "== soft-RoCE guest: datperf over $OURS and $OFED, perftest on $DEV;" \
		"$ROUNDS rounds of 8 B read_lat x $LAT_ITERS, 1 MiB read_bw x $BW_ITERS"
	echo "# host: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)," \
		"commit $(git -C "$top" describe --always --dirty 2>/dev/null || echo '?')" | tee "$out/host.txt"
	start=$SECONDS
	"$top/scripts/rxe-vm" -t "${GUEST_VM_TIMEOUT:-$([ "${BENCH_COST:-1}" = 1 ] && echo 4500 || echo 900)}" \
		-w "$out" -- "$here/run-bench-guest.sh" --inside
	rc=$?
	secs=$((SECONDS - start))
	if [ ! -s "$out/table.txt" ]; then
		echo "run-bench-guest: the soft-RoCE guest did not finish (scripts/rxe-vm exit status $rc" \
			"after ${secs}s; 124: its timeout, GUEST_VM_TIMEOUT); logs in ${out#"$top"/}" >&2
		exit 1
	fi
	cat "$out/table.txt"
	if [ -s "$out/dto-cost/cost-table.txt" ]; then
		cat "$out/dto-cost/cost-table.txt"
		[ -s "$out/dto-cost/failures.txt" ] && cat "$out/dto-cost/failures.txt" >>"$out/failures.txt"
	fi
	if [ -s "$out/failures.txt" ]; then
		echo
		echo "FAILED runs (each with its client and server output):"
		cat "$out/failures.txt"
	fi
	echo "(guest section took ${secs} s, boot included; raw outputs in ${out#"$top"/})"
	[ "$rc" -eq 0 ] && [ ! -s "$out/failures.txt" ]
	exit
fi

# =============================================================== guest side
# shellcheck source=lib.sh
. "$here/lib.sh"
cd "$out" || exit 1
mkdir -p logs
: >results.txt
: >failures.txt
cat >dat.conf <<EOF
$OURS u2.0 nonthreadsafe default libdaplrs-verbs.so.2 dapl.2.0 "verbs $DEV 1" ""
$OFED u2.0 nonthreadsafe default libdaplofa.so.2 dapl.2.0 "rxenet0 0" ""
EOF
export LD_LIBRARY_PATH=$top/build/lib DAT_OVERRIDE=$out/dat.conf
datperf=$top/build/bin/datperf
server_pid=""
trap 'stop_pid "$server_pid"' EXIT
t0=$SECONDS

# record ROUND FIGURE WHO VALUE
record() {
	if [ -n "$4" ]; then
		echo "$1 $2 $3 $4" >>results.txt
		echo "  ok   round $1 $2 $3: $4 [$((SECONDS - t0)) s]"
	else
		fail_run "r$1-$2-$3" "no figure in the client's output"
	fi
}

# datperf's client row: "read_lat 8 ITERS MEDIAN P99 -" / "read_bw 1048576 ITERS - - MB/s"
datperf_lat() {  # ROUND WHO IA
	local tag=r$1-lat-$2
	# shellcheck disable=SC2086  # DATPERF_ARGS is a list of options
	run_pair "$tag" "line:server listening" \
		-- "$datperf" -P "$3" -s -q $DATPERF_QUAL -t read_lat -S 8 -A 60 $DATPERF_ARGS \
		-- "$datperf" -P "$3" -h $ADDR -q $DATPERF_QUAL -t read_lat -S 8 -n "$LAT_ITERS" $DATPERF_ARGS ||
		return 0
	record "$1" lat "$2" "$(awk '$1 == "read_lat" && $2 == 8 { print $4 }' "logs/$tag-client.log")"
}
datperf_bw() {  # ROUND WHO IA
	local tag=r$1-bw-$2
	# shellcheck disable=SC2086
	run_pair "$tag" "line:server listening" \
		-- "$datperf" -P "$3" -s -q $DATPERF_QUAL -t read_bw -S 1M -A 60 $DATPERF_ARGS \
		-- "$datperf" -P "$3" -h $ADDR -q $DATPERF_QUAL -t read_bw -S 1M -N "$BW_ITERS" -B 0 $DATPERF_ARGS ||
		return 0
	record "$1" bw "$2" "$(awk '$1 == "read_bw" && $2 == 1048576 { print $6 }' "logs/$tag-client.log")"
}

# datperf reg_write / reg_read: "reg_write 4096 ITERS MEDIAN ..." and the initiator's
# "reg_write:create" / "reg_write:free" rows. 1 MiB rounds take 50-70 ms under emulation:
# at most 50 of them (-B 50).
datperf_reg() {  # ROUND WHO IA
	local tag=r$1-reg-$2 z k t
	# shellcheck disable=SC2086
	run_pair "$tag" "line:server listening" \
		-- "$datperf" -P "$3" -s -q $DATPERF_QUAL -S 4K,1M -A 60 $DATPERF_ARGS \
		-- "$datperf" -P "$3" -h $ADDR -q $DATPERF_QUAL -t reg -S 4K,1M -n "$REG_ITERS" -B 50 $DATPERF_ARGS ||
		return 0
	for z in 4096 1048576; do
		k=$([ $z = 4096 ] && echo 4k || echo 1m)
		for t in write read; do
			record "$1" "reg_${t}_$k" "$2" "$(awk -v t=reg_$t -v z=$z '$1 == t && $2 == z { print $4 }' "logs/$tag-client.log")"
		done
	done
}

# regcost: "dat_lmr_create 4096 ITERS MEDIAN ..." (ibv_reg_mr for raw).
regcost() {  # ROUND WHO (-P IA | -d DEV)
	local tag=r$1-regcost-$2 log z k
	log=logs/$tag.log
	if ! timeout -k 5 "$STEP_TIMEOUT" "$top/build/bin/regcost" "${@:3}" -n "$REG_ITERS" -S 4K,1M >"$log" 2>&1; then
		fail_run "$tag" "regcost failed"
		return 0
	fi
	for z in 4096 1048576; do
		k=$([ $z = 4096 ] && echo 4k || echo 1m)
		record "$1" "create_$k" "$2" "$(awk -v z=$z '($1 == "dat_lmr_create" || $1 == "ibv_reg_mr") && $2 == z { print $4 }' "$log")"
		record "$1" "free_$k" "$2" "$(awk -v z=$z '($1 == "dat_lmr_free" || $1 == "ibv_dereg_mr") && $2 == z { print $4 }' "$log")"
	done
}

# datscale: the client's "scale ia=.. n=N mode=one .. rtt_med_us=X .. conn_per_s=X ..
# rss_kib_per_conn_client=X rss_kib_per_conn_server=X" row.
datscale_run() {  # ROUND WHO IA N
	local tag=r$1-scale-$2-n$4 row
	run_pair "$tag" "line:server listening" \
		-- "$top/build/bin/datscale" -P "$3" -s -c "$4" -q $SCALE_QUAL -A 60 \
		-- "$top/build/bin/datscale" -P "$3" -h $ADDR -c "$4" -q $SCALE_QUAL -n "$SCALE_ITERS" -D 5 ||
		return 0
	row=$(grep '^scale ' "logs/$tag-client.log" | tr ' ' '\n')
	record "$1" "scale_rtt_$4" "$2" "$(sed -n 's/^rtt_med_us=//p' <<<"$row")"
	record "$1" "scale_conn_$4" "$2" "$(sed -n 's/^conn_per_s=//p' <<<"$row")"
	record "$1" "scale_rssc_$4" "$2" "$(sed -n 's/^rss_kib_per_conn_client=//p' <<<"$row")"
	record "$1" "scale_rsss_$4" "$2" "$(sed -n 's/^rss_kib_per_conn_server=//p' <<<"$row")"
}

# perftest: the client prints the figures. ib_read_lat: "8 ITERS t_min t_max
# t_typical(median) ..." (a whole read, as datperf's read_lat);
# ib_read_bw: "1048576 ITERS peak avg Mpps" in MB/sec = 2^20 B/s, turned
# into 10^6 B/s as datperf reports.
perftest_lat() {  # ROUND
	local tag=r$1-lat-raw args=(-d $DEV -i 1 -x $GID_INDEX -p $PERFTEST_PORT -F -s 8 -n "$LAT_ITERS")
	run_pair "$tag" "tcp:$PERFTEST_PORT" -- ib_read_lat "${args[@]}" -- ib_read_lat "${args[@]}" $ADDR ||
		return 0
	record "$1" lat raw "$(awk '/t_typical/ { h = 1; next } h && $1 == 8 { print $5; exit }' "logs/$tag-client.log")"
}
perftest_bw() {  # ROUND
	local tag=r$1-bw-raw args=(-d $DEV -i 1 -x $GID_INDEX -p $PERFTEST_PORT -F -s 1048576 -n "$BW_ITERS")
	run_pair "$tag" "tcp:$PERFTEST_PORT" -- ib_read_bw "${args[@]}" -- ib_read_bw "${args[@]}" $ADDR ||
		return 0
	record "$1" bw raw "$(awk '/BW average/ { h = 1; next } h && $1 == 1048576 { printf "%.1f\n", $4 * 1.048576; exit }' \
		"logs/$tag-client.log")"
}

echo "run-bench-guest: guest up: $(nproc) vCPUs, kernel $(uname -r), $(ibv_devices | awk '$1 == "rxe0" { print "rxe0 present" }')"
for ((r = 1; r <= ROUNDS; r++)); do
	datperf_lat "$r" ours "$OURS"
	datperf_lat "$r" ofed "$OFED"
	perftest_lat "$r"
	datperf_bw "$r" ours "$OURS"
	datperf_bw "$r" ofed "$OFED"
	perftest_bw "$r"
	datperf_reg "$r" ours "$OURS"
	datperf_reg "$r" ofed "$OFED"
	regcost "$r" ours -P "$OURS"
	regcost "$r" ofed -P "$OFED"
	regcost "$r" raw -d "$DEV"
	for n in $SCALE_NS; do
		datscale_run "$r" ours "$OURS" "$n"
		datscale_run "$r" ofed "$OFED" "$n"
	done
done
took=$((SECONDS - t0))
# The CPU cost per DTO (bench/dto-cost.sh), in the same guest: its own table.
if [ "${BENCH_COST:-1}" = 1 ]; then
	"$here/dto-cost.sh" --inside "$out/dto-cost" || echo "run-bench-guest: dto-cost failed" >>failures.txt
fi

# ------------------------------------------------------------------ table
awk -v rounds="$ROUNDS" -v took="$took" -v lat_n="$LAT_ITERS" -v bw_n="$BW_ITERS" -v reg_n="$REG_ITERS" -v dpargs="$DATPERF_ARGS" \
	-v scale_ns="$SCALE_NS" -v scale_n="$SCALE_ITERS" '
function median(key,   n, i, j, t, a) {
	n = cnt[key]; if (n == 0) return ""
	for (i = 1; i <= n; i++) a[i] = v[key, i]
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function f(x, d) { return x == "" ? "FAIL" : sprintf("%." d "f", x) }
function ratio(a, b) { return (a == "" || b == "" || b == 0) ? "-" : sprintf("%.2f", a / b) }
function rounds_of(key,   i, s) {
	s = ""; for (i = 1; i <= cnt[key]; i++) s = s (i > 1 ? " " : "") v[key, i]
	return s == "" ? "-" : s
}
{ key = $2 SUBSEP $3; v[key, ++cnt[key]] = $4 }
END {
	nfigs = split("lat bw reg_write_4k reg_read_4k reg_write_1m reg_read_1m create_4k free_4k create_1m free_1m", figs, " ")
	split("ours ofed raw", who, " ")
	name["lat"] = "8 B RDMA read latency (median us)"; d["lat"] = 1; raw["lat"] = 1
	name["bw"] = "1 MiB RDMA read bandwidth (MB/s)"; d["bw"] = 1; raw["bw"] = 1
	name["reg_write_4k"] = "reg round, 4 KiB write (us)"; name["reg_read_4k"] = "reg round, 4 KiB read (us)"
	name["reg_write_1m"] = "reg round, 1 MiB write (us)"; name["reg_read_1m"] = "reg round, 1 MiB read (us)"
	name["create_4k"] = "register 4 KiB (us; raw: ibv_reg_mr)"; name["free_4k"] = "free 4 KiB (us; raw: ibv_dereg_mr)"
	name["create_1m"] = "register 1 MiB (us; raw: ibv_reg_mr)"; name["free_1m"] = "free 1 MiB (us; raw: ibv_dereg_mr)"
	for (i = 3; i <= nfigs; i++) { d[figs[i]] = 1; raw[figs[i]] = figs[i] ~ /^(create|free)/ }
	nscale = split(scale_ns, sn, " ")
	for (j = 1; j <= nscale; j++) {
		k = sn[j]
		figs[++nfigs] = "scale_rtt_" k; name["scale_rtt_" k] = "datscale N=" k ": round trip (median us)"
		figs[++nfigs] = "scale_conn_" k; name["scale_conn_" k] = "datscale N=" k ": connections per s"
		figs[++nfigs] = "scale_rssc_" k; name["scale_rssc_" k] = "datscale N=" k ": client KiB per conn"
		figs[++nfigs] = "scale_rsss_" k; name["scale_rsss_" k] = "datscale N=" k ": server KiB per conn"
		d["scale_rtt_" k] = 1; d["scale_conn_" k] = 0; d["scale_rssc_" k] = 1; d["scale_rsss_" k] = 1
	}
	printf "\nsoft-RoCE guest (rxe0, TCG emulation): medians of %d rounds, interleaved\n", rounds
	printf "%-38s %10s %10s %10s | %9s %9s\n", "figure", "ours", "OFED", "raw verbs", "ours:OFED", "ours:raw"
	for (i = 1; i <= nfigs; i++) {
		fg = figs[i]
		for (k = 1; k <= 3; k++) m[who[k]] = median(fg SUBSEP who[k])
		printf "%-38s %10s %10s %10s | %9s %9s\n", name[fg], f(m["ours"], d[fg]), f(m["ofed"], d[fg]),
		       raw[fg] ? f(m["raw"], d[fg]) : "-", ratio(m["ours"], m["ofed"]), ratio(m["ours"], m["raw"])
	}
	print "\nper round (ours / OFED / raw):"
	for (i = 1; i <= nfigs; i++) {
		fg = figs[i]
		printf "  %-4s %s / %s / %s\n", fg, rounds_of(fg SUBSEP "ours"), rounds_of(fg SUBSEP "ofed"), rounds_of(fg SUBSEP "raw")
	}
	print "\nours = datperf over rs-rxe0 (libdaplrs-verbs.so.2); OFED = the same datperf and libdat2 over"
	print "ofa-v2-rxe (libdaplofa.so.2); raw = perftest ib_read_lat (t_typical) / ib_read_bw (BW average)."
	printf "latency: %d reads of 8 B, a whole read each; lower is better, so ours:X > 1 means ours is slower.\n", lat_n
	printf "bandwidth: %d reads of 1 MiB, MB/s = 10^6 B/s; higher is better, so ours:X < 1 means ours is slower.\n", bw_n
	printf "datperf: %s, 32 reads outstanding%s; perftest busy-polls, up to 128 outstanding.\n",
	       dpargs ~ /(^| )-p( |$)/ ? "busy-polling (-p)" : "blocking waits (dat_evd_wait)",
	       dpargs == "" ? "" : " (extra options: " dpargs ")"
	print "reg round: datperf reg_* (both sides register the same buffer per message, one transfer, a finish,"
	printf "both free), %d rounds (1 MiB: 50); register/free: regcost, the same buffer %d times, median of each call.\n", reg_n, reg_n
	if (nscale > 0) {
		print "datscale: N connections on one PSP, EP queues 4/4 sharing one request, receive and connection EVD per side;"
		printf "an 8 B send/recv ping-pong on EP 0 (%d round trips, at most 5 s); connections per s: higher is better;\n", scale_n
		print "KiB per conn: RSS growth (smaps_rollup) from before the first EP to all N connected, over N (N = 1: one-time costs too)."
		print "Both datscale sides spin: in a 2-vCPU emulated guest a run whose spinners share a vCPU reads in ms (see per round)."
	}
	printf "Emulated timings mean nothing alone; the ratios are the result. Measurements took %d s in the guest.\n", took
}' results.txt >table.txt
sync
exit 0
