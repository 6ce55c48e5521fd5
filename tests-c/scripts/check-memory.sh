#!/usr/bin/env bash
# `make check-memory` (issue 11, item 2): sanitizers, valgrind and growth.
#
# 1. AddressSanitizer + UndefinedBehaviorSanitizer: the C test programs, and
#    Debian's dtest and dapltest built from their sources against our
#    headers (build/debian-src, as debian-sources.sh builds them), compiled
#    with -fsanitize=address,undefined (UBSan errors fatal) and run over
#    rs-tcp. The C side is instrumented; our Rust libraries are not (stable
#    Rust has no sanitizer flag), but they run in the same process: their
#    malloc/free go through ASan's allocator (a double or invalid free, or a
#    leak LeakSanitizer finds at exit, is reported wherever it happened),
#    their memcpy/memset/strlen calls are checked by ASan's interceptors, and
#    every write the provider makes into the program's instrumented memory
#    (events, handles, attributes, DTO data) lands in the program's
#    redzone-guarded buffers. Loads and stores compiled from Rust are
#    not checked by ASan; valgrind checks those.
# 2. valgrind memcheck of whole processes, our Rust libraries included
#    (uninstrumented build/tests binaries, and Debian's own dtest from
#    dapl2-utils through our libdat2): any invalid read or write, use of
#    uninitialised memory, bad free or definite leak fails the run
#    (--error-exitcode). tests-c/suppressions/valgrind.supp (every run) and
#    valgrind-dtest.supp (Debian's dtest only) suppress only what lies
#    outside our code, each entry with its reason; lsan.supp likewise for
#    LeakSanitizer.
# 3. Growth: test_cycles with the issue's counts (10,000 IA open/close
#    cycles with every object type, 100,000 connect/disconnect cycles; RSS,
#    fds and threads flat) and test_resources full (a million LMRs).
#
# Logs in build/tests-memory. Prints "check-memory: N passed, N failed".
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
out="$top/build/tests-memory"
asan="$out/asan"
export LD_LIBRARY_PATH="$top/build/lib"
export DAT_OVERRIDE="$top/build/tests/dat.conf"
ia=rs-tcp addr=127.0.0.1
conf_name=check-memory
. "$top/tests-c/scripts/conformance-lib.sh"

rm -rf "$out"
mkdir -p "$asan"

# ------------------------------------------------------------ ASan + UBSan
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cflags="-O1 -g -Wall -Wextra -std=gnu11 $san -I$top/include"
link2="-L$top/build/lib -Wl,-rpath,$top/build/lib -l:libdat2.so.2"
link12="-L$top/build/lib -Wl,-rpath,$top/build/lib -ldat"
# LeakSanitizer runs at exit; UBSan stops at the first error.
# fast_unwind_on_malloc=0: full allocation stacks through libc (for the
# leak suppressions in lsan.supp, which name the caller of asprintf).
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:fast_unwind_on_malloc=0"
export LSAN_OPTIONS="suppressions=$top/tests-c/suppressions/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

progs20="test_provider_handles test_dto_rules test_remote_violation test_peer_killed test_srq test_connect_errors
	test_ib_ext test_dat2_ops test_csp test_evd_rules test_ud test_registry test_cycles test_resources"
progs12="test_dat12_rules test_misuse12 test_registry12"

# run NAME LOG CMD...: CMD under a timeout; passes on exit 0 with a
# "0 failed" summary if it prints one, and no sanitizer or valgrind report.
run() {
	local name=$1 log=$2; shift 2
	timeout 900 "$@" > "$log" 2>&1
	local rc=$?
	local summary
	summary=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
	if [ $rc -eq 0 ] && ! grep -Eq 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$log" &&
		{ [ -z "$summary" ] || grep -q ' 0 failed' <<<"$summary"; }; then
		ok
		echo "  ok   $name${summary:+ ($summary)}"
	else
		bad "$name: exit $rc; $(grep -Em1 'ERROR: |runtime error:|FAIL' "$log") (see $log)"
	fi
}

echo "== ASan + UBSan: the C tests"
(cd "$top/tests-c/programs" && cc $cflags -c seed12_synopsis.c -o "$asan/seed12_synopsis.o") > "$asan/build.log" 2>&1
for p in $progs20 $progs12; do
	case " $progs12 " in
	*" $p "*) extra="" lk=$link12 ;;
	*) extra="-rdynamic" lk=$link2 ;;
	esac
	[ "$p" = test_dat12_rules ] && extra="$asan/seed12_synopsis.o"
	if ! (cd "$top/tests-c/programs" && cc $cflags $p.c $extra -o "$asan/$p" $lk) >> "$asan/build.log" 2>&1; then
		bad "$p does not build with $san (see $asan/build.log)"
		continue
	fi
	# test_registry's mock provider (mock_provider.c, test code) never frees
	# its objects, on purpose (a freed handle must stay readable), and is
	# unloaded before exit, so LeakSanitizer cannot even name it: leak
	# detection is off for that one program (the registry it tests runs
	# with leak detection in every other program here).
	if [ "$p" = test_registry ]; then
		ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" run "asan $p (no leak check)" "$asan/$p.log" "$asan/$p"
	else
		run "asan $p" "$asan/$p.log" "$asan/$p"
	fi
done

# Debian's dtest and dapltest from their sources, instrumented the same way.
src=${DAPL_SRC:-$top/build/debian-src/dapl-2.1.10.1.f1e05b7a}
if [ -f "$src/test/dtest/dtest.c" ]; then
	echo "== ASan + UBSan: Debian's dtest and dapltest (from source)"
	p0=$passed f0=$failed
	dflags="-g -O1 -D_GNU_SOURCE $san -I$top/include"
	dlink="-L$top/build/lib -Wl,-rpath,$top/build/lib -ldat2 -lpthread"
	dapltest_dir="$src/test/dapltest"
	dapltest_srcs=$(sed -n '/^dapltest_SOURCES/,/^[[:space:]]*$/p' "$dapltest_dir/Makefile.am" |
		grep -o '[A-Za-z0-9_/]*\.c' | tr '\n' ' ')
	if cc $dflags "$src/test/dtest/dtest.c" -o "$asan/dtest" $dlink > "$asan/build-dtest.log" 2>&1; then
		out=$asan dtest_pair env dtest "waiting for client connection" 15828 \
			'FAILED|ERROR|Sanitizer|runtime error' "" "$asan/dtest"
	else
		bad "dtest does not build with $san (see $asan/build-dtest.log)"
	fi
	if (cd "$dapltest_dir" && cc $dflags -DDAT_EXTENSIONS -I include -I mdep/linux $dapltest_srcs \
		-o "$asan/dapltest" $dlink) > "$asan/build-dapltest.log" 2>&1; then
		if out=$asan start_server "$asan/dapltest-server.log" "Service Point Ready" \
			timeout 300 "$asan/dapltest" -T S -D $ia; then
			out=$asan client env dapltest-T "$asan/dapltest" -T T -s $addr -D $ia -i 100 -t 1 -w 1 -V -P \
				client SR 1024 -f server SR 1536 2 -f client RW 4096 1 server RR 1024 1
			out=$asan client env dapltest-Q "$asan/dapltest" -T Q -s $addr -D $ia
			if finish_server 30 && ! grep -Eq 'Sanitizer|runtime error' "$asan/dapltest-server.log"; then ok; else
				bad "ASan dapltest server (see $asan/dapltest-server.log)"
			fi
		fi
	else
		bad "dapltest does not build with $san (see $asan/build-dapltest.log)"
	fi
	for f in "$asan"/env-*.log "$asan"/dapltest-server.log; do
		if grep -Eq 'Sanitizer|runtime error' "$f"; then bad "sanitizer report in $f"; fi
	done
	echo "  ASan dtest pair, dapltest server + transaction client + quit: $((passed - p0)) passed," \
		"$((failed - f0)) failed (logs $asan/env-*.log)"
else
	bad "no Debian dapl source at $src (make -C tests-c debian-src fetches it): ASan dtest/dapltest not run"
fi
unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS

# ---------------------------------------------------------------- valgrind
echo "== valgrind memcheck (whole processes, Rust libraries included)"
vg="$out/valgrind"
mkdir -p "$vg"
# --max-threads: test_resources opens 250 IAs, each with its progress thread and the thread
# that holds its same-host table's liveness lock (valgrind's default is 500 threads).
vgflags="--tool=memcheck --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite
	--track-origins=yes --fair-sched=yes --num-callers=40 --max-threads=2000
	--suppressions=$top/tests-c/suppressions/valgrind.supp"
bin="$top/build/tests"
for t in "test_dto_rules" "test_remote_violation" "test_evd_rules" "test_srq" "test_dat12_rules" \
	"test_provider_handles" "test_cycles 20 50" "test_resources valgrind"; do
	set -- $t
	name=$1
	run "valgrind $t" "$vg/$name.log" valgrind $vgflags --log-file="$vg/$name.vg.%p" "$bin/$name" "${@:2}"
	# the verdict's figures, for the report
	grep -h 'ERROR SUMMARY\|definitely lost:' "$vg/$name".vg.* 2>/dev/null | sed 's/^==[0-9]*== /       /' | sort -u
done
# Debian's dtest binary (dapl2-utils) through our libdat2, both sides under
# valgrind. Not through dtest_pair: a server under valgrind takes longer to
# listen than its 10 s readiness wait; here the wait is 120 s (a bound, not
# a sleep: the client starts as soon as port 15828 listens). Over TCP
# (DAPLRS_SAME_HOST=never): on the same-host path the peer process places the
# data, which valgrind cannot see, so every byte dtest prints of what it
# received is "uninitialised" (313 errors, none ours); the path itself is
# checked by the programs above.
if command -v dtest > /dev/null; then
	p0=$passed f0=$failed
	vgdtest="$vgflags --suppressions=$top/tests-c/suppressions/valgrind-dtest.supp"
	export DAPLRS_SAME_HOST=never
	timeout 600 valgrind $vgdtest --log-file="$vg/dtest.vg.%p" dtest -P $ia -s > "$vg/dtest-server.log" 2>&1 &
	server_pid=$!
	for _ in $(seq 1200); do
		ss -ltnH "sport = :15828" 2>/dev/null | grep -q . && break
		kill -0 $server_pid 2>/dev/null || break
		sleep 0.1
	done
	run "valgrind dtest client" "$vg/dtest-client.log" valgrind $vgdtest --log-file="$vg/dtest.vg.%p" \
		dtest -P $ia -h $addr
	if wait $server_pid && ! grep -Eq 'FAILED|ERROR' "$vg/dtest-server.log"; then
		ok
		echo "  ok   valgrind dtest server"
	else
		bad "valgrind dtest server (see $vg/dtest-server.log)"
	fi
	grep -h 'ERROR SUMMARY\|definitely lost:' "$vg"/dtest.vg.* 2>/dev/null | sed 's/^==[0-9]*== /       /' | sort -u
	unset DAPLRS_SAME_HOST
else
	bad "no dtest (dapl2-utils) for the valgrind pair"
fi

# ------------------------------------------------------------------ growth
echo "== growth: 10,000 IA cycles, 100,000 connection cycles; a million LMRs"
run "test_cycles 10000 100000" "$out/cycles.log" "$bin/test_cycles" 10000 100000
grep -E '^(IA open|connect/)' "$out/cycles.log" | sed 's/^/       /'
run "test_resources full" "$out/resources-full.log" "$bin/test_resources" full
grep -E '^(EVD overflow|EPs|IAs|fds|PZs|EVDs|SRQs|RMRs|LMRs):' "$out/resources-full.log" | sed 's/^/       /'

echo "check-memory: $passed passed, $failed failed"
[ $failed -eq 0 ]
