#!/usr/bin/env bash
# Debian's unmodified dapltest (dapl2-utils) through our libdat2: the
# hardware-connection FFT cases that need no RDMA device. Case 1 opens
# unregistered IA names and expects DAT_PROVIDER_NOT_FOUND; case 2 closes a
# NULL IA and expects DAT_INVALID_HANDLE. The IA named is OFED's entry for
# ib0, served by Debian's libdaplofa.so.2 (cases 0 and 3 need a device).
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=$(LD_LIBRARY_PATH="$here/../../build/lib" DAT_OVERRIDE="$here/../../build/tests/dat.conf" \
	timeout 60 dapltest -T F -D ofa-v2-ib0 -f hwconn 2>&1)
# which libdat2 dapltest really used
lib=$(LD_LIBRARY_PATH="$here/../../build/lib" ldd "$(command -v dapltest)" | awk '/libdat2/ {print $3}')
passed=0 failed=0
result_of() { printf '%s\n' "$out" | awk -v c="case: $1" 'index($0, c) {f=1} f && /Result:/ {print $2; exit}'; }
for c in 1 2; do
	r=$(result_of $c)
	if [ "$r" = PASS ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "hwconn case $c: ${r:-no result}"; fi
done
case "$lib" in
	"$here/../../build/lib/libdat2.so.2"|*/build/lib/libdat2.so.2) passed=$((passed + 1)) ;;
	*) failed=$((failed + 1)); echo "dapltest did not load our libdat2 ($lib)" ;;
esac
# dapltest's own output only when something is wrong: cases 0 and 3 fail
# here by design (no ib0), which would read as noise otherwise.
[ $failed -eq 0 ] || printf '%s\n' "$out" | sed 's/^/  | /'
echo "conformance-hwconn: $passed passed, $failed failed"
