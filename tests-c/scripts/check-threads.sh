#!/usr/bin/env bash
# `make check-threads`: test_threads under ThreadSanitizer, with our own
# libraries instrumented too.
#
# What gives real signal here, and what does not (measured, issue 11):
#  - The C test alone built with -fsanitize=thread, over our normal
#    libraries: TSan sees the C side's accesses and the calls it intercepts
#    inside our libraries (malloc/free, send/recv, memcpy) but none of the
#    synchronisation there (parking_lot and std locks are atomics plus
#    futex(2), uninstrumented): every run reports dozens of "races" between
#    a free and its malloc in another thread, all false. No signal.
#  - valgrind's helgrind/drd: the same blindness (they know pthread
#    primitives, not futex-based locks), and 50x slower. No signal.
#  - Rust's TSan (-Zsanitizer=thread with -Zbuild-std, nightly only, and
#    rust-src): std, parking_lot, libc and all our crates are instrumented,
#    so every lock's atomics give TSan its happens-before edges; only the
#    kernel (socket buffers) is outside it. This is what this script runs:
#    libdat2.so.2 and libdaplrs.so.2 built that way into build/tsan/lib,
#    test_threads built with -fsanitize=thread against them, run over
#    rs-tcp's threadsafe entry.
# It covers our registry, the provider's C layer, core and TCP backend as
# test_threads drives them (posting on shared and private EPs, several
# reapers on one EVD, reposting, object churn, connect/disconnect). It
# cannot cover the verbs backend (libibverbs is not instrumented) nor code
# paths test_threads does not reach. CI's machine has stable Rust only:
# there this says SKIPPED (and why) instead of passing.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
out=$top/build/tsan
target=x86_64-unknown-linux-gnu
args=${CHECK_THREADS_ARGS:-300 1 4 4 3}

skip() {
	echo "check-threads: SKIPPED: $*"
	echo "check-threads: no race check was run (this is not a pass)"
	exit 0
}

command -v rustup >/dev/null 2>&1 || skip "rustup is not installed (a nightly Rust toolchain is needed)"
rustup run nightly rustc --version >/dev/null 2>&1 ||
	skip "no nightly Rust toolchain (Rust's ThreadSanitizer is nightly-only: rustup toolchain install nightly)"
sysroot=$(rustup run nightly rustc --print sysroot)
[ -d "$sysroot/lib/rustlib/src/rust/library" ] ||
	skip "the nightly toolchain has no rust-src (-Zbuild-std needs it: rustup component add rust-src --toolchain nightly)"
echo 'int main(void){return 0;}' > /tmp/check-threads-probe.$$.c
if ! ${CC:-cc} -fsanitize=thread /tmp/check-threads-probe.$$.c -o /tmp/check-threads-probe.$$ 2>/dev/null; then
	rm -f /tmp/check-threads-probe.$$*
	skip "${CC:-cc} cannot build with -fsanitize=thread (libtsan missing)"
fi
rm -f /tmp/check-threads-probe.$$*

echo "check-threads: building libdat2 and libdaplrs with -Zsanitizer=thread (nightly, -Zbuild-std) into $out"
mkdir -p "$out/lib" "$out/obj"
(cd "$top" && RUSTFLAGS="-Zsanitizer=thread" cargo +nightly build -q -Zbuild-std --target $target --release \
	-p dat2 -p daplrs-ffi --target-dir target/tsan) || { echo "check-threads: 0 passed, 1 failed (build)"; exit 1; }
rel=$top/target/tsan/$target/release
cc=${CC:-cc}
# rustc's LLVM emits __tsan_memcpy/memmove/memset, which GCC's older libtsan
# lacks: each calls the libc function, which libtsan intercepts and checks
# the same way.
cat > "$out/obj/tsan_mem.c" <<'C'
#include <string.h>
void *__tsan_memcpy(void *d, const void *s, size_t n) { return memcpy(d, s, n); }
void *__tsan_memmove(void *d, const void *s, size_t n) { return memmove(d, s, n); }
void *__tsan_memset(void *d, int c, size_t n) { return memset(d, c, n); }
C
$cc -O1 -fno-builtin -fPIC -c "$out/obj/tsan_mem.c" -o "$out/obj/tsan_mem.o" &&
	$cc -O1 -g -fsanitize=thread -fPIC -c "$top/src/libdat2/c/extension_op.c" -o "$out/obj/extension_op.o" &&
	$cc -shared -fsanitize=thread -o "$out/lib/libdat2.so.2" -Wl,-soname,libdat2.so.2 \
		-Wl,--version-script="$top/src/libdat2/libdat2.map" "$out/obj/extension_op.o" "$out/obj/tsan_mem.o" \
		-Wl,--whole-archive "$rel/libdat2.a" -Wl,--no-whole-archive -ldl -lpthread &&
	$cc -shared -fsanitize=thread -o "$out/lib/libdaplrs.so.2" -Wl,-soname,libdaplrs.so.2 \
		-Wl,--version-script="$top/src/provider-ffi/libdaplrs.map" "$out/obj/tsan_mem.o" \
		-Wl,--whole-archive "$rel/libdaplrs_ffi.a" -Wl,--no-whole-archive -ldl -lpthread &&
	$cc -O1 -g -fsanitize=thread -pthread -std=gnu11 -I"$top/include" "$top/tests-c/programs/test_threads.c" \
		-o "$out/test_threads" -L"$out/lib" -Wl,-rpath,"$out/lib" -l:libdat2.so.2 ||
	{ echo "check-threads: 0 passed, 1 failed (link)"; exit 1; }

passed=0 failed=0
# Positive control first: test_threads with a race of its own (it rewrites
# a buffer it posted before the send completes, TEST_THREADS_RACE) must be
# reported, else TSan does not see what our libraries do and a clean run
# below would mean nothing.
ctl=$out/control.log
LD_LIBRARY_PATH="$out/lib" DAT_OVERRIDE="$top/build/tests/dat.conf" TEST_THREADS_RACE=1 \
	TSAN_OPTIONS="halt_on_error=0 report_signal_unsafe=0 history_size=4 ${TSAN_OPTIONS:-}" \
	timeout 600 "$out/test_threads" 50 0 1 2 1 > "$ctl" 2>&1
if grep -q '^WARNING: ThreadSanitizer: data race' "$ctl"; then
	passed=$((passed + 1))
	echo "check-threads: positive control: the planted race was reported ($(grep -c '^WARNING: ThreadSanitizer' "$ctl") report(s))"
else
	failed=$((failed + 1))
	echo "check-threads: positive control: the planted race was NOT reported (log: $ctl)"
fi

log=$out/test_threads.log
echo "check-threads: test_threads $args under ThreadSanitizer (log: $log)"
LD_LIBRARY_PATH="$out/lib" DAT_OVERRIDE="$top/build/tests/dat.conf" \
	TSAN_OPTIONS="halt_on_error=0 report_signal_unsafe=0 history_size=4 ${TSAN_OPTIONS:-}" \
	timeout 1200 "$out/test_threads" $args > "$log" 2>&1
rc=$?
races=$(grep -c '^WARNING: ThreadSanitizer' "$log")
grep -E '^test_threads: ' "$log"
if [ "$races" = 0 ]; then passed=$((passed + 1)); else
	failed=$((failed + 1))
	echo "check-threads: $races ThreadSanitizer report(s); the first:"
	awk '/^WARNING: ThreadSanitizer/ {n++} n == 1' "$log" | head -60
fi
# test_threads' own checks must hold under TSan too (a TSan report alone
# makes the exit status 66)
if grep -q '^test_threads: [0-9]* passed, 0 failed' "$log" && { [ $rc = 0 ] || [ $rc = 66 ]; }; then
	passed=$((passed + 1))
else
	failed=$((failed + 1))
	echo "check-threads: test_threads failed under TSan (exit $rc):"
	grep -E '^FAIL' "$log" | head -20
fi
echo "check-threads: $passed passed, $failed failed"
[ $failed = 0 ]
