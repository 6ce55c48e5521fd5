#!/usr/bin/env bash
# Debian's uDAPL test programs over the libfabric entry rs-ofi-tcp ("ofi tcp
# 127.0.0.1", build/tests/ofi-dat.conf: libfabric's tcp provider, FI_EP_MSG),
# two processes on this host: dapltest (its FFT suites, the limit test, the
# transaction and performance lines of the conformance set, as
# conformance-dapltest.sh runs them over rs-tcp), dtest, dtestcm, dtestx
# (-p, -q) and dtestsrq (conformance-lib.sh: every server under a timeout,
# ready by its log line or listening port).
#
# The programs are those debian-sources.sh builds from Debian's dapl source
# against our headers (build/tests/debian-sources/bin); when they are not
# there, this builds them (DEBIAN_SOURCES_BUILD_ONLY), and without Debian's
# source (no network) runs Debian's packaged ones (dapl2-utils), saying so.
#
# What libfabric's tcp provider lacks is said, not failed: dtestx's atomics
# (it has none: dtestx reads the provider's attributes and skips them) and
# dtestx -u (an entry of connected endpoints has no datagram EPs: they ride
# on the handshake of reliable-datagram entries, docs/libfabric.md, Datagrams).
#
# DAT_TEST_IA=rs-ofi-shm runs dtestx and dtestx -p alone, over shm, whose
# atomics the backend maps: there they must run (CMP_SWAP and FETCH_ADD
# PASSED, nothing skipped); then dtestx -c -u (datagram EPs over libfabric's
# udp: the entry's dgram=udp) and dtestsrq (the SRQ of our own over
# reliable datagrams: docs/libfabric.md, "Shared receive queues").
#
# DAT_TEST_IA=rs-ofi-rxm runs the same over tcp;ofi_rxm (FI_EP_RDM, our
# connection layer), dtestsrq included (SRQs of our own, as over shm) and
# dtestx -c -u (datagram EPs over udp, dgram=udp); dtestcm there with
# libfabric's defaults.
#
# Prints "ofi-dapltest: N passed, N failed".
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
ia=${DAT_TEST_IA:-rs-ofi-tcp} addr=127.0.0.1
case $ia in
rs-ofi-tcp) out="$top/build/tests/ofi-dapltest" ;;
rs-ofi-rxm)
	out="$top/build/tests/ofi-dapltest-rxm"
	# dtestcm's 1000 endpoints a side, each a port of its own: with ofi_rxm's
	# shared receive context off (the backend's default) an endpoint's buffers
	# are touched as messages come, not at fi_enable; 0.5 s and 11 MB a side
	# here, idle. A bound for loaded machines all the same.
	dtestcm_timeout=120
	dtestcm_grace=60
	;;
rs-ofi-shm) out="$top/build/tests/ofi-dapltest-shm" only_dtestx=1 ;;
*) echo "ofi-dapltest: DAT_TEST_IA=$ia: only rs-ofi-tcp, rs-ofi-rxm and rs-ofi-shm are run here"; exit 1 ;;
esac
mkdir -p "$out"
conf_name=ofi-dapltest
# Datagram EPs: the reliable-datagram entries have them (dgram=udp); a
# connected entry's PSPs are libfabric's passive endpoints, which carry none.
[ "$ia" = rs-ofi-tcp ] &&
	no_datagrams="rs-ofi-tcp connects (FI_EP_MSG): datagram EPs ride on the handshake of reliable-datagram entries (docs/libfabric.md, Datagrams)"
. "$top/tests-c/scripts/conformance-lib.sh"

conf="$top/build/tests/ofi-dat.conf"
ofi_env() { env LD_LIBRARY_PATH="$top/build/lib" DAT_OVERRIDE="$conf" "$@"; }

bin="$top/build/tests/debian-sources/bin"
have_all() { local p; for p in dapltest dtest dtestcm dtestx dtestsrq; do [ -x "$bin/$p" ] || return 1; done; }
if ! have_all; then
	DEBIAN_SOURCES_BUILD_ONLY=1 "$top/tests-c/scripts/debian-sources.sh" > "$out/build.log" 2>&1
fi
if have_all; then
	echo "ofi-dapltest: Debian's programs built from its source ($bin)"
else
	bin=$(dirname "$(command -v dapltest)")
	echo "ofi-dapltest: NOTE: no build from Debian's source (see $out/build.log): Debian's packaged programs ($bin)"
fi
[ -f "$conf" ] || bad "no $conf (make -C tests-c writes it)"

if [ -n "${only_dtestx:-}" ]; then
	dtestx_pair ofi_env dtestx "$bin/dtestx"
	dtestx_pair ofi_env dtestx-p "$bin/dtestx" -p
	for f in "$out"/ofi_env-dtestx-client.log "$out"/ofi_env-dtestx-p-client.log; do
		if grep -q "Skipping" "$f" || ! grep -q "CMP_SWAP test - PASSED" "$f" ||
			! grep -q "FETCH_ADD test - PASSED" "$f"; then
			bad "$(basename "$f" -client.log): atomics did not run over $ia (see $f)"
		else
			ok
		fi
	done
	dtestx_pair ofi_env dtestx-u "$bin/dtestx" -c -u
	dtest_pair ofi_env dtestsrq "ready on port" - 'FAILED|ERROR|Error|ERR[: ]' "Test Complete" "$bin/dtestsrq"
	echo "ofi-dapltest: $passed passed, $failed failed"
	[ $failed -eq 0 ]
	exit
fi

for suite in hwconn endpoint pz mem connmgt queryinfo; do dapltest_bin="$bin/dapltest" fft ofi_env "$suite"; done

# As in conformance-dapltest.sh: the exhaustion loops end in a failing create
# or post by design; what must not happen is a setup or cleanup failure.
log="$out/limit.log"
limit_errors='error occurs|free fails|close \(graceful\) error|reset fails|disconnect.*fails|bogus outputs|Mismatch'
if ofi_env timeout 300 "$bin/dapltest" -T L -D $ia -w 8 -m 100 > "$log" 2>&1 && ! grep -Eq "$limit_errors" "$log"; then
	ok
else
	bad "dapltest -T L: $(grep -Em1 "$limit_errors" "$log") (see $log)"
fi

dapltest_transactions ofi_env "$bin"

# dtestx ran its atomics only where the provider says it has them.
for f in "$out"/ofi_env-dtestx-client.log "$out"/ofi_env-dtestx-p-client.log; do
	[ -f "$f" ] || continue
	if grep -q "Skipping CMP and SWAP" "$f" && grep -q "Skipping FETCH and ADD" "$f"; then
		echo "ofi-dapltest: $(basename "$f" -client.log): atomics skipped by dtestx ($ia has none: tcp has no atomics; tcp;ofi_rxm 1.17 offers them only without the send-after-write order its entry needs)"
	fi
done
echo "ofi-dapltest: $passed passed, $failed failed"
[ $failed -eq 0 ]
