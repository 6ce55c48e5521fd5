#!/usr/bin/env bash
# The verbs layer of `make test` (`make test-verbs`): the RDMA-applicable
# tests, run inside a throw-away qemu guest with a soft-RoCE device
# (scripts/rxe-vm: rxe0 on netdev rxenet0 = 192.0.2.1/24, port 1). The guest
# sees the host's root read-only, so build/ runs unchanged; build/tests/verbs
# is shared read-write and keeps every log.
#
# Which C programs run where is in tests-c/passes (tests-verbs*.pass and
# *.subset, read through pass-list.sh; each file says why a test is not in it).
# In the guest, each counted as pass/fail:
#  - the C tests of passes/tests-verbs.pass with DAT_TEST_IA=rs-rxe0;
#  - the provider crate's DAT behaviour tests (src/provider/src/
#    behaviour_tests.rs, the Rust tests that run over TCP and the same-host
#    path in `make test-rust`) over our verbs backend on each device, port 1:
#    build/tests/daplrs-behaviour-verbs (top-level Makefile) with
#    DAPLRS_TEST_DEVICE=verbs:$dev:1, each test counted;
#  - the DAT 1.2 suite on rs-rxe0's u1.2 entry (passes/tests-verbs-dat12.subset:
#    test_dat12_rules, test_misuse12, and interop12.sh, a 1.2 and a 2.0 process
#    exchanging sends and RDMA reads over the verbs provider); not with
#    VERBS_IA=ofa-v2-rxe (OFED's provider serves DAT 2.0 only);
#  - our verbs provider under the names of its three ia_params forms
#    ("verbs rxe0 1", "verbs rxenet0", "verbs 192.0.2.1"): each opens with
#    address 192.0.2.1, and dtest runs between two of them;
#  - Debian's dapltest (server + transaction and performance tests, limit
#    test, FFT suites), dtest, dtest -c (CNO), dtestcm, dtestx, dtestx -p
#    and dtestsrq on rs-rxe0;
#  - library mixes on the dapltest transaction lines: our libdat2 with OFED's
#    provider (ofa-v2-rxe), OFED's libdat2 with our provider (by full path);
#  - wire mixes: a dapltest server all OFED's (libdat2 + provider) with a
#    client all ours, and the reverse;
#  - our libfabric backend (libdaplrs-ofi.so.2) over libfabric's verbs
#    provider on rxe0: "ofi verbs;ofi_rxm rxe0" (rs-ofi-vrxm, reliable
#    datagrams with our connection layer) and "ofi verbs rxe0" (rs-ofi-vmsg,
#    connected endpoints): the C programs that pass there (passes/
#    tests-verbs-ofi-vrxm.pass and tests-verbs-ofi-vmsg.pass), the
#    DAT behaviour tests (over_ofi_device::*) on each, and on rs-ofi-vrxm
#    Debian's dapltest (as on rs-rxe0), dtest, dtest -c, dtestx, dtestx -p,
#    dtestx -q and dtestsrq.
#  - on siw0, read-sink-wire.py: the connection captured while
#    test_read_sink_wire reads, no read request naming the consumer's memory;
#    then passes/tests-verbs-sink-mr.subset with DAPLRS_VERBS_SINK_MR=always;
#  - last, test_device_removal on each device: removed (rdma link delete) under
#    open IAs with reads in flight, and added back.
# Ends with one line "verbs-guest: N passed, N failed" (run-tests.sh adds it
# to the total). A guest that does not boot is one failure, never a skip.
#
# Env: VERBS_IA=ofa-v2-rxe runs everything named "ours" on OFED's
#      libdaplofa.so.2 instead (to validate this harness while our verbs
#      provider is incomplete); VERBS_VM_TIMEOUT (default 5400 s) bounds the
#      guest; DTESTCM_CONNS (default 100) is dtestcm's connection count;
#      VERBS_KINDS= runs the ofi section alone, OFI_VRXM_PASS="test_x ...",
#      OFI_VMSG_PASS="...", OFI_DEBIAN=0 and OFI_RUST=0 narrow it (below).
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
pass_list=$top/tests-c/scripts/pass-list.sh
# The passes of tests-c/passes this script runs
passes="tests-verbs tests-verbs-sink-mr tests-verbs-dat12 tests-verbs-ofi-vrxm tests-verbs-ofi-vmsg"
out="$top/build/tests/verbs"
base=$out
VERBS_IA=${VERBS_IA:-rs-rxe0}
# rxe: soft-RoCE rxe0 (192.0.2.1); siw: soft-iWARP siw0 (198.51.100.1), its logs in $out/siw;
# VERBS_KINDS= (empty) runs only the ofi section (logs in $out/ofi)
VERBS_KINDS=${VERBS_KINDS-rxe siw}
export VERBS_IA VERBS_KINDS

# ============================================================== host side
if [ "${1:-}" != --inside ]; then
	case "$VERBS_IA" in
	rs-rxe0) ;;
	ofa-v2-rxe) echo "verbs-guest: VERBS_IA=ofa-v2-rxe: every 'ours' entry below is OFED's libdaplofa.so.2 (harness validation)" ;;
	*) echo "verbs-guest: VERBS_IA must be rs-rxe0 (default) or ofa-v2-rxe, not '$VERBS_IA'"
	   echo "verbs-guest: 0 passed, 1 failed"; exit 1 ;;
	esac
	for l in libdaplrs-verbs.so.2 libdaplrs-ofi.so.2; do
		if [ "$VERBS_IA" = rs-rxe0 ] && [ ! -e "$top/build/lib/$l" ]; then
			echo "verbs-guest: FAIL: $top/build/lib/$l is missing (run make at the top first)"
			echo "verbs-guest: 0 passed, 1 failed"
			exit 1
		fi
	done
	# every program the passes name (not the scripts, names with a dot), and those run apart
	progs="test_device_removal test_read_sink_wire test_interop12 test_interop20"
	for p in $passes; do
		if ! names=$("$pass_list" "$p"); then
			echo "verbs-guest: FAIL: cannot read pass $p (tests-c/passes)"
			echo "verbs-guest: 0 passed, 1 failed"
			exit 1
		fi
		progs="$progs $(printf '%s\n' "$names" | grep -v '\.' | tr '\n' ' ')"
	done
	for t in $progs; do
		if [ ! -x "$top/build/tests/$t" ]; then
			echo "verbs-guest: FAIL: $top/build/tests/$t is missing (run make -C tests-c all first)"
			echo "verbs-guest: 0 passed, 1 failed"
			exit 1
		fi
	done
	if [ "$VERBS_IA" = rs-rxe0 ] && [ ! -x "$top/build/tests/daplrs-behaviour-verbs" ]; then
		echo "verbs-guest: FAIL: $top/build/tests/daplrs-behaviour-verbs is missing (make build/tests/daplrs-behaviour-verbs at the top)"
		echo "verbs-guest: 0 passed, 1 failed"
		exit 1
	fi
	rm -rf "$out"
	mkdir -p "$out"
	start=$(date +%s)
	"$top/scripts/rxe-vm" -t "${VERBS_VM_TIMEOUT:-5400}" -w "$out" -- "$top/tests-c/scripts/verbs-guest.sh" --inside
	rc=$?
	secs=$(($(date +%s) - start))
	if [ ! -s "$out/result" ]; then
		echo "verbs-guest: FAIL: the soft-RoCE/soft-iWARP guest did not boot or did not finish (scripts/rxe-vm exit status $rc after ${secs}s; 124: its timeout, VERBS_VM_TIMEOUT)"
		echo "verbs-guest: 0 passed, 1 failed"
		exit 1
	fi
	read -r passed failed < "$out/result"
	echo "verbs-guest: guest run took ${secs}s (boot included); logs in $out"
	echo "verbs-guest: $passed passed, $failed failed"
	[ "$failed" -eq 0 ] && [ "$rc" -eq 0 ]
	exit
fi

# ============================================================= guest side
cd "$out" || exit 1
passed=0 failed=0
t0=$(date +%s)
elapsed() { echo "$(($(date +%s) - t0))s"; }
tag=
ok() { passed=$((passed + 1)); echo "  ok   $tag$* [$(elapsed)]"; }
bad() { failed=$((failed + 1)); echo "  FAIL $tag$* [$(elapsed)]"; }
finish() { echo "$passed $failed" > "$base/result"; sync; exit 0; }
trap finish EXIT
# read_pass VAR NAME: VAR = what pass NAME runs (tests-c/passes), names
# separated by spaces; one failure if the pass cannot be read
read_pass() {
	local names
	if names=$("$pass_list" "$2"); then
		printf -v "$1" '%s' "$(printf '%s\n' "$names" | tr '\n' ' ')"
	else
		printf -v "$1" '%s' ""
		bad "cannot read pass $2 (tests-c/passes)"
	fi
}
read_pass VERBS_PASS tests-verbs
read_pass VERBS_SINK_MR tests-verbs-sink-mr
read_pass VERBS_DAT12 tests-verbs-dat12

libdir=/usr/lib/x86_64-linux-gnu
if [ "$VERBS_IA" = rs-rxe0 ]; then
	lib=libdaplrs-verbs.so.2 libpath=$top/build/lib/libdaplrs-verbs.so.2
else
	lib=libdaplofa.so.2 libpath=$libdir/libdaplofa.so.2
fi
# kind KIND: the names and address of one device kind (rxe: RoCE, siw: iWARP);
# p_dev, p_net, p_ip are our three ia_params forms (OFED's under VERBS_IA=ofa-v2-rxe).
kind() {
	case $1 in
	rxe) dev=rxe0 netdev=rxenet0 ADDR=192.0.2.1 OURS=rs-rxe0 NET_IA=rs-rxenet0 IP_IA=rs-ip OFA=ofa-v2-rxe ;;
	siw) dev=siw0 netdev=siwnet0 ADDR=198.51.100.1 OURS=rs-siw0 NET_IA=rs-siwnet0 IP_IA=rs-siwip OFA=ofa-v2-siw ;;
	esac
	if [ "$VERBS_IA" = rs-rxe0 ]; then
		p_dev="\"verbs $dev 1\"" p_net="\"verbs $netdev\"" p_ip="\"verbs $ADDR\""
	else
		p_dev="\"$netdev 0\"" p_net="\"$netdev 0\"" p_ip="\"$ADDR 0\""
	fi
}
# dat.conf for our libdat2 (libraries by name) and for OFED's (ours by path);
# the u1.2 entries serve the DAT 1.2 programs (our libdat.so.1)
for k in rxe siw; do
	kind $k
	echo "$OURS u2.0 nonthreadsafe default $lib dapl.2.0 $p_dev \"\""
	echo "$OURS u2.0 threadsafe default $lib dapl.2.0 $p_dev \"\""
	[ "$VERBS_IA" = rs-rxe0 ] && echo "$OURS u1.2 nonthreadsafe default $lib dapl.1.2 $p_dev \"\""
	[ "$VERBS_IA" = rs-rxe0 ] && echo "$OURS u1.2 threadsafe default $lib dapl.1.2 $p_dev \"\""
	echo "$NET_IA u2.0 nonthreadsafe default $lib dapl.2.0 $p_net \"\""
	echo "$IP_IA u2.0 nonthreadsafe default $lib dapl.2.0 $p_ip \"\""
	echo "$OFA u2.0 nonthreadsafe default libdaplofa.so.2 dapl.2.0 \"$netdev 0\" \"\""
done > "$out/dat.conf"
# our libfabric backend over libfabric's verbs provider on rxe0 (ofi_suite)
ofi_lib=$top/build/lib/libdaplrs-ofi.so.2
for v in "u2.0 nonthreadsafe default $ofi_lib dapl.2.0" "u1.2 nonthreadsafe default $ofi_lib dapl.1.2" \
	"u2.0 threadsafe default $ofi_lib dapl.2.0" "u1.2 threadsafe default $ofi_lib dapl.1.2"; do
	echo "rs-ofi-vrxm $v \"ofi verbs;ofi_rxm rxe0 dgram=verbs\" \"\""
	echo "rs-ofi-vmsg $v \"ofi verbs rxe0\" \"\""
done >> "$out/dat.conf"
sed "s|default $lib |default $libpath |" "$out/dat.conf" > "$out/ofed-dat.conf"

# Every command runs under a timeout of $tmo seconds (servers set a longer one).
tmo=180
ours_env() { timeout -k 5 "$tmo" env LD_LIBRARY_PATH="$top/build/lib" DAT_OVERRIDE="$base/dat.conf" "$@"; }
ofed_env() { timeout -k 5 "$tmo" env -u LD_LIBRARY_PATH DAT_OVERRIDE="$base/ofed-dat.conf" "$@"; }
ulimit -l unlimited 2>/dev/null

echo "verbs-guest: in the guest: $(rdma link show 2>&1 | tr '\n' ';')"
echo "verbs-guest: dat.conf:"; sed 's/^/    /' "$out/dat.conf"

# Starts a server in the background, bounded by $server_tmo seconds (default
# 400); waits (up to 60 s) until its log says it is ready. Sets server_pid.
start_server() {
	local log=$1 ready=$2 tmo=${server_tmo:-400}; shift 2
	"$@" > "$log" 2>&1 &
	server_pid=$!
	for _ in $(seq 600); do
		grep -q "$ready" "$log" && return 0
		kill -0 $server_pid 2>/dev/null || break
		sleep 0.1
	done
	bad "server did not become ready: $* (see $log)"
	kill $server_pid 2>/dev/null
	wait $server_pid 2>/dev/null
	return 1
}

# run NAME CMD...: a client or a single command; passes on exit status 0.
run() {
	local name=$1; shift
	local log="$out/$name.log"
	if "$@" > "$log" 2>&1; then ok "$name"; else bad "$name: exit $? (see $log)"; fi
}

# c_test LABEL LOG IA SECONDS PROGRAM: one C test program on IA (DAT_TEST_IA),
# bounded by SECONDS; a pass when it exits 0 saying "N passed, 0 failed",
# else a failure with its first FAIL lines.
c_test() {
	local label=$1 log=$2 ia=$3 secs=$4 prog=$5 rc
	DAT_TEST_IA=$ia tmo=$secs ours_env "$prog" > "$log" 2>&1
	rc=$?
	if [ $rc -eq 0 ] && grep -q ' passed, 0 failed' "$log"; then
		ok "$label ($(grep -E 'passed, [0-9]+ failed' "$log" | tail -1))"
	else
		bad "$label: exit $rc, $(grep -E 'passed, [0-9]+ failed' "$log" | tail -1) (see $log)"
		grep -m5 'FAIL' "$log" | sed 's/^/       /'
	fi
}

# Debian's programs (dtest_pair, transactions, dapltest_limit, dapltest_fft,
# dtestx_pair, dtestsrq_pair): the rxe and siw sections' suite and the ofi
# section run them.
# dtest family: server on SRV_IA, client on CLI_IA, both through ENVF.
dtest_pair() {
	local name=$1 envf=$2 srv_ia=$3 cli_ia=$4 prog=$5; shift 5
	local slog="$out/$name-server.log"
	if start_server "$slog" "Waiting for connect request\|listening\|waiting" \
		$envf $prog -P "$srv_ia" -s "$@"; then
		run "$name-client" $envf $prog -P "$cli_ia" -h $ADDR "$@"
		local failed=0
		grep -q FAILED "$out/$name-client.log" && failed=1 && bad "$name client reported FAILED (see $out/$name-client.log)"
		if wait $server_pid && ! grep -q FAILED "$slog"; then ok "$name-server"; else failed=1; bad "$name server (see $slog)"; fi
		# what the device's kernel driver said (siw's TERMINATEs, rxe's retries)
		if [ $failed = 1 ]; then
			dmesg 2>/dev/null | grep -E 'siw|rxe|rdma' | tail -20 > "$out/$name-dmesg.log"
		fi
	fi
}
# dtest's defaults move 2000 RDMA writes of 4 MiB (over 2 minutes under
# TCG): 20 of 64 KiB prove the same paths.
DTEST_SIZE=(-B 20 -b 65536)

# transactions NAME SRV_ENV SRV_IA CLI_ENV CLI_IA [full]: the dapltest server
# and the transaction lines of the conformance set, then -T Q. With full:
# the performance lines too, and the 4x4 line with its 4096 iterations (2-3
# minutes under TCG); without, that line runs 512 (the mixes, run 4 times).
transactions() {
	local name=$1 senv=$2 sia=$3 cenv=$4 cia=$5 perf=${6:-} iters=512
	[ -n "$perf" ] && iters=4096
	local slog="$out/$name-dapltest-server.log"
	local server_tmo=400
	[ -n "$perf" ] && server_tmo=800 # it outlives the long 4x4 line below
	start_server "$slog" "Service Point Ready" $senv dapltest -T S -D "$sia" || return
	run "$name-T-SR" $cenv dapltest -T T -s $ADDR -D "$cia" -i 100 -t 1 -w 1 client SR 256 1 server SR 256 1
	run "$name-T-SR-validate" $cenv dapltest -T T -s $ADDR -D "$cia" -i 100 -t 1 -w 1 -V -P \
		client SR 1024 -f server SR 1536 2 -f
	run "$name-T-RW-RR" $cenv dapltest -T T -P -t 1 -w 1 -i 4096 -s $ADDR -D "$cia" client RW 4096 1 \
		server RW 2048 4 server RR 1024 1 client RR 2048 1 client SR 1024 3 -f server SR 256 3 -f
	# Its full 4096 iterations took 157 s and, once, over 180 s under TCG on a busy 2-CPU
	# host (512 take 15-30 s): it gets a bound of its own.
	local t44=$tmo
	[ -n "$perf" ] && t44=480
	tmo=$t44 run "$name-T-4x4" $cenv dapltest -T T -s $ADDR -D "$cia" -i $iters -t 4 -w 4 client SR 8192 3 server SR 8192 3
	run "$name-T-4x4-validate" $cenv dapltest -T T -s $ADDR -D "$cia" -i 256 -t 4 -w 4 -V \
		client SR 8192 3 server SR 8192 3
	if [ -n "$perf" ]; then
		run "$name-P-RW" $cenv dapltest -T P -s $ADDR -D "$cia" -i 2048 -m b RW 4096 2
		run "$name-P-RR" $cenv dapltest -T P -s $ADDR -D "$cia" -i 4096 RR 32768 1
	fi
	run "$name-Q" $cenv dapltest -T Q -s $ADDR -D "$cia"
	if wait $server_pid; then ok "$name dapltest server exit"; else bad "$name dapltest server exit status (see $slog)"; fi
}

# dapltest_limit NAME IA: dapltest's limit test. Exhaustion loops end in a
# failing create or post by design, up to -m; what must not happen is a setup
# or cleanup failure.
dapltest_limit() {
	local name=$1 ia=$2 log="$out/$1-limit.log"
	local limit_errors='error occurs|free fails|close \(graceful\) error|reset fails|disconnect.*fails|bogus outputs|Mismatch'
	if tmo=300 ours_env dapltest -T L -D "$ia" -w 8 -m 100 > "$log" 2>&1 && ! grep -Eq "$limit_errors" "$log"; then
		ok "$name-limit"
	else
		bad "$name-limit: $(grep -Em1 "$limit_errors" "$log") (see $log)"
	fi
}

# dapltest_fft NAME IA: the FFT suites, every case PASS (queryinfo case 5 is UNSUPP in dapltest itself:
# "tested in the conmgt test"), no assertion failed.
dapltest_fft() {
	local name=$1 ia=$2 suite log rc bads n failed_in
	for suite in hwconn endpoint pz mem connmgt queryinfo; do
		log="$out/$name-fft-$suite.log"
		ours_env dapltest -T F -D "$ia" -f $suite > "$log" 2>&1
		rc=$?
		bads=$(awk '/case: *[0-9]+/ {c=$NF} /^Result:/ {print c, $2}' "$log" |
			awk -v s=$suite -v k=$k '$2 != "PASS" && !(s == "queryinfo" && $1 == 5 && $2 == "UNSUPP") &&
				!(k == "siw" && s == "queryinfo" && $1 == 9) {printf " case %s %s", $1, $2}')
		# queryinfo case 9 queries an RMR: soft-iWARP has none (max_rmrs 0)
		[ $k = siw ] && [ $suite = queryinfo ] && echo "  skip $tag""$name-fft-queryinfo case 9 (dat_rmr_query): siw0 has no RMRs"
		n=$(grep -c '^Result:' "$log")
		failed_in=$(grep 'failed in file' "$log")
		# (case 9's assertion on siw, see above)
		[ $k = siw ] && [ $suite = queryinfo ] && failed_in=$(grep 'failed in file' "$log" | grep -v 'dapl_fft_queryinfo.c, line 286')
		if [ $rc -eq 0 ] && [ "$n" -gt 0 ] && [ -z "$bads" ] && [ -z "$failed_in" ]; then
			ok "$name-fft-$suite ($n cases)"
		else
			bad "$name-fft-$suite: exit $rc, $n cases,${bads:- } $(grep -m1 'failed in file' "$log") (see $log)"
		fi
	done
}

# The IB extensions (write with immediate data, atomics; -p adds the counters) as OFED's
# provider passes them on rxe.
# dtestx does not flush its output, so its server is ready when its address
# exchange port (15828) listens; its server also creates its service point only
# after sending its address, so a client that connects in between is rejected
# ("!conn established: 0x4003"): that outcome alone is retried, up to four
# times, the client at nice 19 (so that the server creates its service point first).
# dtestx_pair NAME IA "SERVER ARGS" "CLIENT ARGS"
dtestx_pair() {
	local name=$1 ia=$2 sargs=$3 cargs=$4 try slog clog rc src nice=""
	for try in 1 2 3 4 5; do
		slog="$out/$name-server.log" clog="$out/$name-client.log"
		ours_env dtestx -P "$ia" $sargs > "$slog" 2>&1 &
		server_pid=$!
		for _ in $(seq 600); do
			ss -ltn 2>/dev/null | grep -q ':15828 ' && break
			kill -0 $server_pid 2>/dev/null || break
			sleep 0.1
		done
		ours_env $nice dtestx -P "$ia" $cargs -h $ADDR > "$clog" 2>&1
		rc=$?
		wait $server_pid
		src=$?
		if [ $try -lt 5 ] && [ $rc -ne 0 ] && grep -Eq '!conn established: 0x(4003|40004)$' "$clog"; then
			echo "  note $name: the client connected before the server's PSP existed (dtestx's race); once more"
			nice="nice -n 19"
			continue
		fi
		break
	done
	if [ $rc -eq 0 ] && [ $src -eq 0 ] && ! grep -q 'FAILED\|ERROR' "$clog" "$slog"; then
		ok "$name"
	else
		bad "$name: client exit $rc, server exit $src (see $clog, $slog)"
	fi
}

# dtestsrq_pair NAME IA: dtestsrq, connections sharing one SRQ, its low-watermark event, EP_BROKEN on
# the async EVD at disconnect. It can exit 0 after an error, so both logs must
# say "Test Complete" and neither an error.
dtestsrq_pair() {
	local name=$1 ia=$2; shift 2
	local slog="$out/$name-server.log" clog="$out/$name-client.log"
	if start_server "$slog" "ready" ours_env dtestsrq -P "$ia" -s "$@"; then
		ours_env dtestsrq -P "$ia" -h $ADDR "$@" > "$clog" 2>&1
		local rc=$?
		wait $server_pid
		local src=$?
		if [ $rc -eq 0 ] && [ $src -eq 0 ] && grep -q 'Test Complete' "$clog" && grep -q 'Test Complete' "$slog" &&
			! grep -qi 'error\|FAIL' "$clog" "$slog"; then
			ok "$name"
		else
			bad "$name: client exit $rc, server exit $src (see $clog, $slog)"
		fi
	fi
}

# suite: everything below on the device kind set by `kind`.
suite() {
# --- 1. the C tests on our IA (passes/tests-verbs.pass)
for t in $VERBS_PASS; do
	c_test "$t" "$out/$t.log" "$OURS" 200 "$top/build/tests/$t"
done

# --- 1a. iWARP NICs read into sinks registered for each read alone (sink.rs); siw
# reads into a bounce buffer, DAPLRS_VERBS_SINK_MR=always gives it the NICs' way
# (our provider only). The wire check: no read request names the consumer's
# memory (read-sink-wire.py captures the connection as root).
if [ $k = siw ] && [ "$VERBS_IA" = rs-rxe0 ]; then
	c_test "read-sink-wire" "$out/read-sink-wire.log" "$OURS" 200 "$top/tests-c/scripts/read-sink-wire.py"
	for t in $VERBS_SINK_MR; do
		DAPLRS_VERBS_SINK_MR=always c_test "$t (read sinks of their own)" "$out/$t-sink-mr.log" "$OURS" 200 "$top/build/tests/$t"
	done
fi

# --- 1b. the DAT 1.2 suite on rs-rxe0's u1.2 entry (our provider only;
# passes/tests-verbs-dat12.subset)
if [ "$VERBS_IA" = rs-rxe0 ]; then
	for t in $VERBS_DAT12; do
		prog=$top/build/tests/$t
		case $t in *.*) prog=$top/tests-c/scripts/$t ;; esac
		c_test "$t" "$out/$t.log" "$OURS" 200 "$prog"
	done
fi

# --- 1c. the Rust DAT behaviour tests over our verbs backend (not OFED's: they
# drive the provider crate's core directly).
if [ "$VERBS_IA" = rs-rxe0 ]; then
	rust_behaviour "verbs:$dev:1" over_verbs
fi

# --- 2. the three ia_params forms of our provider
for ia in $OURS $NET_IA $IP_IA; do
	log="$out/datinfo-$ia.log"
	tmo=60 ours_env "$top/build/bin/datinfo" "$ia" > "$log" 2>&1
	if grep -q "IA address $ADDR" "$log"; then ok "datinfo $ia: IA address $ADDR"; else bad "datinfo $ia (see $log)"; fi
done
# what datinfo says the device supports: RoCE everything; iWARP (siw) no
# atomics, no immediate data, no UD, no memory windows (reads into 1 segment: split)
if [ "$VERBS_IA" = rs-rxe0 ]; then
	log="$out/datinfo-$OURS.log"
	if [ $k = siw ]; then
		# siw reads into one segment: a read into more is split (more than 1 here)
		if grep -q ', iWARP, link active' "$log" && grep -q 'max RMRs 0 (no memory windows' "$log" &&
			grep -Eq 'RDMA read into ([2-9]|[1-9][0-9]+) segments' "$log" &&
			! grep -Eq 'DAT_IB_(FETCH_AND_ADD|CMP_AND_SWAP|IMMED_DATA|UD)' "$log"; then
			ok "datinfo $OURS: iWARP, no RMRs, atomics, immediate data or UD; reads split"
		else
			bad "datinfo $OURS: not what siw0 has (see $log)"
		fi
		# siw pins registrations against RLIMIT_MEMLOCK even for root: at Debian's default
		# (8 MiB) datinfo says so, and a registration beyond it (dtest's server) fails saying why
		log="$out/memlock-$OURS.log"
		(ulimit -l 8192 && tmo=60 ours_env "$top/build/bin/datinfo" "$OURS" &&
			tmo=60 ours_env dtest -P "$OURS" -s) > "$log" 2>&1
		if grep -q 'locked-memory limit 8192 KiB' "$log" && grep -q 'pin their pages against RLIMIT_MEMLOCK, 8192 KiB' "$log"; then
			ok "memlock $OURS: datinfo shows the limit, a registration beyond it says why it failed"
		else
			bad "memlock $OURS: no word of RLIMIT_MEMLOCK (see $log)"
		fi
	elif grep -q ', RoCE, GID' "$log" && grep -q 'DAT_IB_FETCH_AND_ADD DAT_IB_CMP_AND_SWAP DAT_IB_IMMED_DATA DAT_IB_UD' "$log"; then
		ok "datinfo $OURS: RoCE with atomics, immediate data and UD"
	else
		bad "datinfo $OURS: not what rxe0 has (see $log)"
	fi
fi

dtest_pair dtest-$netdev-to-ip ours_env $NET_IA $IP_IA dtest "${DTEST_SIZE[@]}"

# --- 3. dapltest, dtest, dtestcm on our IA
transactions ours ours_env $OURS ours_env $OURS full
dapltest_limit ours $OURS
dapltest_fft ours $OURS

dtest_pair ours-dtest ours_env $OURS $OURS dtest "${DTEST_SIZE[@]}"
dtest_pair ours-dtest-cno ours_env $OURS $OURS dtest -c "${DTEST_SIZE[@]}"
conns=${DTESTCM_CONNS:-100}
dtest_pair ours-dtestcm ours_env $OURS $OURS dtestcm -c "$conns"
# dtestx moves data with write-with-immediate and atomics, which iWARP has
# not (the provider refuses them, DAT_NOT_IMPLEMENTED; test_ib_ext checks that)
if [ $k = siw ]; then
	echo "  skip $tag""ours-dtestx, ours-dtestx-counters: write with immediate data and atomics, which iWARP has not"
else
	dtestx_pair ours-dtestx $OURS "-s" ""
	dtestx_pair ours-dtestx-counters $OURS "-s -p" "-p"
fi
dtestsrq_pair ours-dtestsrq $OURS
# dtestx -u: unreliable datagrams (UD QPs); with -u a client needs -c (the
# server's trailing -s makes it the server again). OFED's provider fails this
# mode on soft-RoCE ("create_qp Invalid argument").
if [ $k = siw ]; then
	echo "  skip $tag""ours-dtestx-ud: iWARP has no datagram QPs"
else
	dtestx_pair ours-dtestx-ud $OURS "-s -u" "-c -u"
fi

# --- 4. library mixes
transactions libdat2-ours+ofa-provider ours_env $OFA ours_env $OFA
transactions libdat2-ofed+our-provider ofed_env $OURS ofed_env $OURS

# --- 5. wire mixes: all OFED's on one side, all ours on the other
transactions wire-ofed-server+ours-client ofed_env $OFA ours_env $OURS
transactions wire-ours-server+ofed-client ours_env $OURS ofed_env $OFA
}

# rust_behaviour DEVICE PREFIX [TEST...]: the provider crate's DAT behaviour
# tests (tests named PREFIX::*) on DAPLRS_TEST_DEVICE=DEVICE, each test one
# pass or failure, but the TESTs named (known to fail there: said, not run);
# a binary that ends badly with no test failed is one failure more.
rust_behaviour() {
	local device=$1 prefix=$2 skips=() t; shift 2
	for t in "$@"; do
		skips+=(--skip "$prefix::$t")
		echo "  note $tag""rust $prefix::$t not run on $device (known to fail there: docs/libfabric.md, Where it stands)"
	done
	# one log per device: the ofi section runs the same prefix on two
	local log="$out/rust-behaviour-${prefix}-$(printf %s "$device" | tr -c 'a-zA-Z0-9_' -).log"
	DAPLRS_TEST_DEVICE=$device timeout -k 5 600 "$top/build/tests/daplrs-behaviour-verbs" \
		--ignored "$prefix::" "${skips[@]}" --test-threads=2 --show-output > "$log" 2>&1
	local rc=$? n_ok=0 n_bad=0
	# A file, not a process substitution: the guest's root has no /dev/fd.
	grep -E "^test behaviour_tests::$prefix::[a-z0-9_]+ \.\.\. " "$log" > "$log.results"
	while read -r _ name _ result; do
		case "$result" in
		ok) ok "rust ${name#behaviour_tests::}"; n_ok=$((n_ok + 1)) ;;
		*)
			bad "rust ${name#behaviour_tests::}: $result (see $log)"; n_bad=$((n_bad + 1))
			# the panic's message, so a CI log says why
			sed -n "/^thread '$name' .*panicked/{n;s/^/       /;p;q}" "$log"
			;;
		esac
	done < "$log.results"
	grep '^SKIP ' "$log" | sed 's/^/  note /'
	if [ $n_ok -eq 0 ] || { [ $rc -ne 0 ] && [ $n_bad -eq 0 ]; }; then
		bad "rust behaviour tests on $device: exit $rc, $n_ok passed, $n_bad failed (see $log)"
		# the log lives in the build tree of the machine that ran it: its end, so a CI log says why
		tail -n 25 "$log" | sed 's/^/       /'
	fi
}

# The C programs that pass over libfabric's verbs provider: passes/
# tests-verbs-ofi-vrxm.pass and tests-verbs-ofi-vmsg.pass (each says what is
# not run, and why). Each list may be set from the environment, to run a few
# of them: OFI_VRXM_PASS="test_x test_y".
[ -n "${OFI_VRXM_PASS+set}" ] || read_pass OFI_VRXM_PASS tests-verbs-ofi-vrxm
[ -n "${OFI_VMSG_PASS+set}" ] || read_pass OFI_VMSG_PASS tests-verbs-ofi-vmsg
# The behaviour tests known to fail there (docs/libfabric.md, Where it stands).
OFI_VRXM_FAILING=${OFI_VRXM_FAILING-""}
OFI_VMSG_FAILING=${OFI_VMSG_FAILING-""}
# OFI_DEBIAN=0 leaves Debian's programs out of the ofi section, OFI_RUST=0 the
# behaviour tests (to run a few C programs alone).
OFI_DEBIAN=${OFI_DEBIAN:-1} OFI_RUST=${OFI_RUST:-1}
# ofi_suite IA DEVICE "PROGRAMS" "FAILING": our libfabric backend on rxe0
# through IA (dat.conf) and DEVICE (the behaviour tests'): the C programs
# PROGRAMS, the behaviour tests but FAILING.
ofi_suite() {
	local ia=$1 device=$2 progs=$3 failing=$4 t
	# shellcheck disable=SC2086 # word lists
	for t in $progs; do
		prog=$top/build/tests/$t
		case $t in *.*) prog=$top/tests-c/scripts/$t ;; esac
		c_test "$ia $t" "$out/$ia-$t.log" "$ia" 300 "$prog"
	done
	# shellcheck disable=SC2086
	[ "$OFI_RUST" = 1 ] && rust_behaviour "$device" over_ofi_device $failing
}

# ofi_debian NAME IA: Debian's programs over our libfabric backend on IA, as
# suite runs them on rs-rxe0: dapltest (transaction and performance lines,
# limit test, FFT suites), dtest, dtest -c, dtestx, dtestx -q and dtestsrq.
ofi_debian() {
	local name=$1 ia=$2 log="$out/datinfo-$2.log"
	transactions "$name" ours_env "$ia" ours_env "$ia" full
	dapltest_limit "$name" "$ia"
	dapltest_fft "$name" "$ia"
	dtest_pair "$name-dtest" ours_env "$ia" "$ia" dtest "${DTEST_SIZE[@]}"
	dtest_pair "$name-dtest-cno" ours_env "$ia" "$ia" dtest -c "${DTEST_SIZE[@]}"
	# dtestx's first transfer is a write with immediate data, with or without
	# -p; it skips the atomics the IA does not report itself.
	tmo=60 ours_env "$top/build/bin/datinfo" "$ia" > "$log" 2>&1
	if grep -q DAT_IB_IMMED_DATA "$log"; then
		dtestx_pair "$name-dtestx" "$ia" "-s" ""
		dtestx_pair "$name-dtestx-counters" "$ia" "-s -p" "-p"
	else
		bad "$name-dtestx: $ia reports no write with immediate data, dtestx's first transfer (see $log; docs/libfabric.md)"
	fi
	run "$name-dtestx-q" ours_env dtestx -P "$ia" -q
	grep -q "Open_Query: $ia num_attrs" "$out/$name-dtestx-q.log" || bad "$name-dtestx-q printed no Open_Query line"
	dtestsrq_pair "$name-dtestsrq" "$ia"
	# datagrams over the entry's dgram= provider (verbs UD on rxe0)
	if [ "$ia" = rs-ofi-vrxm ]; then
		dtestx_pair "$name-dtestx-ud" "$ia" "-s -u" "-c -u"
	else
		echo "  skip $tag$name-dtestx-ud: $ia has no datagram EPs (dgram= is not set; docs/libfabric.md)"
	fi
}

for k in $VERBS_KINDS; do
	kind $k
	out=$base
	tag=
	if [ $k != rxe ]; then out=$base/$k tag="$k: "; mkdir -p "$out"; fi
	if ! rdma link show $dev/1 > /dev/null 2>&1; then
		bad "no $dev in the guest (scripts/rxe-vm could not build or load its module; see its messages above)"
		continue
	fi
	echo "verbs-guest: $k ($dev, $ADDR):"
	suite
done
if [ "$VERBS_IA" = rs-rxe0 ] && rdma link show rxe0/1 > /dev/null 2>&1; then
	k=rxe
	kind $k
	out=$base/ofi tag="ofi: "
	mkdir -p "$out"
	echo "verbs-guest: ofi (libfabric's verbs provider on rxe0):"
	ofi_suite rs-ofi-vrxm "ofi:verbs;ofi_rxm:rxe0" "$OFI_VRXM_PASS" "$OFI_VRXM_FAILING"
	[ "$OFI_DEBIAN" = 1 ] && ofi_debian vrxm rs-ofi-vrxm
	ofi_suite rs-ofi-vmsg "ofi:verbs:rxe0" "$OFI_VMSG_PASS" "$OFI_VMSG_FAILING"
fi
# --- last, as it takes the device away: an RDMA device removed under open IAs
# (test_device_removal.c: once it says "ready", the device is deleted, and added back
# after). Each kind's device in turn.
device_removal() {
	local log="$out/test_device_removal.log" pid del rc drc
	DAT_TEST_IA=$OURS tmo=150 ours_env "$top/build/tests/test_device_removal" > "$log" 2>&1 &
	pid=$!
	for _ in $(seq 300); do
		grep -q '^ready' "$log" && break
		kill -0 $pid 2> /dev/null || break
		sleep 0.1
	done
	timeout 120 rdma link delete "$dev" &
	del=$!
	wait $pid
	rc=$?
	wait $del
	drc=$?
	if [ $rc -eq 0 ] && [ $drc -eq 0 ] && grep -q ' passed, 0 failed' "$log"; then
		ok "device removal on $dev ($(grep -E 'passed, [0-9]+ failed' "$log" | tail -1))"
	else
		bad "device removal on $dev: exit $rc, rdma link delete exit $drc, $(grep -E 'passed, [0-9]+ failed' "$log" | tail -1) (see $log)"
		grep -m5 'FAIL' "$log" | sed 's/^/       /'
	fi
	rdma link add "$dev" type "$1" netdev "$netdev"
	if rdma link show "$dev/1" 2> /dev/null | grep -q ACTIVE; then
		ok "$dev added back"
	else
		bad "$dev not back after its removal"
	fi
}
if [ "$VERBS_IA" = rs-rxe0 ]; then
	for k in $VERBS_KINDS; do
		kind $k
		out=$base tag=
		[ $k != rxe ] && out=$base/$k tag="$k: "
		rdma link show $dev/1 > /dev/null 2>&1 && device_removal $k
	done
fi
echo "verbs-guest: guest tests took $(elapsed)"
