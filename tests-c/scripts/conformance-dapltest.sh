#!/usr/bin/env bash
# Debian's unmodified uDAPL conformance binaries (dapl2-utils) against our
# provider rs-tcp on 127.0.0.1: every dapltest command line of the DAT
# conformance set, dtest, dtestcm, dtestx (IB extensions: write with
# immediate data, atomics; again with -p, the counters; -q, the open-query
# extension through the registry) and dtestsrq (an
# SRQ under several connections), through our libdat2; then the FFT suites
# and the same pairs again through OFED's own libdat2 loading our provider.
#
# Usage: conformance-dapltest.sh [ours|ofed|all]   (default all)
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
out="$top/build/tests/conformance"
mkdir -p "$out"
ia=rs-tcp addr=127.0.0.1
which=${1:-all}
conf_name=conformance
# ok, bad, start_server, client, fft, dtest_family
. "$top/tests-c/scripts/conformance-lib.sh"

ours_env() { env LD_LIBRARY_PATH="$top/build/lib" DAT_OVERRIDE="$top/dat.conf" "$@"; }
# OFED's libdat2 (from the system) with a dat.conf naming our library by path.
sed "s|libdaplrs.so.2|$top/build/lib/libdaplrs.so.2|" "$top/dat.conf" > "$out/ofed-dat.conf"
ofed_env() { env -u LD_LIBRARY_PATH DAT_OVERRIDE="$out/ofed-dat.conf" "$@"; }

if [ "$which" = ours ] || [ "$which" = all ]; then
	for suite in hwconn endpoint pz mem connmgt queryinfo; do fft ours_env "$suite"; done

	# Exhaustion loops end in a failing create or post ("... fails") by
	# design, up to -m; what must not happen is a setup or cleanup failure.
	log="$out/limit.log"
	limit_errors='error occurs|free fails|close \(graceful\) error|reset fails|disconnect.*fails|bogus outputs|Mismatch'
	if ours_env timeout 300 dapltest -T L -D $ia -w 8 -m 100 > "$log" 2>&1 && ! grep -Eq "$limit_errors" "$log"; then
		ok
	else
		bad "dapltest -T L: $(grep -Em1 "$limit_errors" "$log") (see $log)"
	fi

	dapltest_transactions ours_env ""
fi

if [ "$which" = ofed ] || [ "$which" = all ]; then
	for suite in hwconn endpoint pz mem connmgt; do fft ofed_env "$suite"; done
	# OFED's libdat2 dispatches queryinfo case 13 (dat_cno_query on an IA
	# handle) by dereferencing the small integer IA handle and crashes
	# before any provider is called; cases up to 12 are checked.
	fft ofed_env queryinfo 12
	dapltest_transactions ofed_env ""
fi
echo "conformance-dapltest: $passed passed, $failed failed"
