#!/usr/bin/env bash
# datinfo as a new user meets it: the repo's dat.conf shows rs-tcp with its
# IA address, its u2.0 entries and its u1.2 ones (opened through libdat.so.1,
# as a DAT 1.2 program opens them); entries that cannot work say exactly why.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
conf=$(mktemp /tmp/datinfo-check.XXXXXX)
trap 'rm -f "$conf"' EXIT
passed=0 failed=0
expect() { if grep -qF -- "$2" <<<"$1"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "datinfo-check: missing '$2' in:"; echo "$1"; fi; }
reject() { if grep -qF -- "$2" <<<"$1"; then failed=$((failed + 1)); echo "datinfo-check: unexpected '$2' in:"; echo "$1"; else passed=$((passed + 1)); fi; }
# The lines datinfo shows for the entry whose heading starts with $2.
entry() { awk -v h="$2" 'index($0, h) == 1 { on = 1 } on && /^$/ { on = 0 } on' <<<"$1"; }

out=$(DAT_OVERRIDE="$top/dat.conf" "$top/build/bin/datinfo" 2>&1)
expect "$out" "rs-tcp  u2.0 nonthreadsafe default  libdaplrs.so.2  \"tcp lo\""
expect "$out" "IA address 127.0.0.1"
e=$(entry "$out" "rs-tcp  u1.2 nonthreadsafe default  libdaplrs.so.2")
expect "$e" "DAT 1.2 entry, opened through "
expect "$e" "IA address 127.0.0.1"

cat > "$conf" <<CONF
rs-missing u2.0 nonthreadsafe default libdaplrs-missing.so.2 dapl.2.0 "tcp lo" ""
rs-nosuchif u2.0 nonthreadsafe default libdaplrs.so.2 dapl.2.0 "tcp nosuchif0" ""
CONF
out=$(DAT_OVERRIDE="$conf" "$top/build/bin/datinfo" 2>&1); rc=$?
expect "$out" "cannot load: provider library 'libdaplrs-missing.so.2': libdaplrs-missing.so.2: cannot open shared object file"
expect "$out" "rs-nosuchif"
expect "$out" "interface nosuchif0 does not exist or has no IPv4 address"
[ $rc -ne 0 ] && passed=$((passed + 1)) || { failed=$((failed + 1)); echo "datinfo-check: exit status 0 despite failing entries"; }

# DAT 1.2 entries alone: each opened through libdat.so.1 with the detail a
# 2.0 entry shows (not loaded through the 2.0 registry, where the provider
# registers nothing); those that cannot work say why, as 2.0 ones do.
cat > "$conf" <<CONF
rs-tcp u1.2 nonthreadsafe default libdaplrs.so.2 dapl.1.2 "tcp lo" ""
rs-tcp u1.2 threadsafe default libdaplrs.so.2 dapl.1.2 "tcp lo" ""
rs-missing12 u1.2 nonthreadsafe default libdaplrs-missing.so.2 dapl.1.2 "tcp lo" ""
rs-nosuchif12 u1.2 nonthreadsafe default libdaplrs.so.2 dapl.1.2 "tcp nosuchif0" ""
CONF
out=$(DAT_OVERRIDE="$conf" "$top/build/bin/datinfo" 2>&1); rc=$?
reject "$out" "did not register a provider"
e=$(entry "$out" "rs-tcp  u1.2 nonthreadsafe default  libdaplrs.so.2")
expect "$e" "DAT 1.2 entry, opened through "
expect "$e" "/libdat.so.1"
expect "$e" "IA address 127.0.0.1, adapter \"tcp:lo\", vendor \"udapl-rs\", provider \"rs-tcp\""
expect "$e" "max EPs "
expect "$e" "SRQ yes, max private data "
expect "$e" "thread safe no, DAT API 1.2"
e=$(entry "$out" "rs-tcp  u1.2 threadsafe default  libdaplrs.so.2")
expect "$e" "IA address 127.0.0.1"
expect "$e" "thread safe yes, DAT API 1.2"
e=$(entry "$out" "rs-missing12  u1.2")
expect "$e" "cannot load: provider library 'libdaplrs-missing.so.2': libdaplrs-missing.so.2: cannot open shared object file"
e=$(entry "$out" "rs-nosuchif12  u1.2")
expect "$e" "the provider refused to open it: DAT_INSUFFICIENT_RESOURCES"
expect "$e" "interface nosuchif0 does not exist or has no IPv4 address"
[ $rc -ne 0 ] && passed=$((passed + 1)) || { failed=$((failed + 1)); echo "datinfo-check: exit status 0 despite failing 1.2 entries"; }
# ofi entries: libfabric's provider, domain, endpoint type, MR mode and limits, or
# the exact reason (the fi_* call and fi_strerror, or what the provider lacks).
ofi_lib="$top/build/lib/libdaplrs-ofi.so.2"
cat > "$conf" <<CONF
rs-ofi-tcp u2.0 nonthreadsafe default $ofi_lib dapl.2.0 "ofi tcp lo" ""
rs-ofi-tcp u1.2 nonthreadsafe default $ofi_lib dapl.1.2 "ofi tcp lo" ""
rs-ofi-none u2.0 nonthreadsafe default $ofi_lib dapl.2.0 "ofi nosuchprov" ""
rs-ofi-shmdg u2.0 nonthreadsafe default $ofi_lib dapl.2.0 "ofi shm dgram=udp" ""
rs-ofi-tcpdg u2.0 nonthreadsafe default $ofi_lib dapl.2.0 "ofi tcp lo dgram=udp" ""
CONF
out=$(DAT_OVERRIDE="$conf" "$top/build/bin/datinfo" 2>&1)
for api in 2.0 1.2; do
	e=$(entry "$out" "rs-ofi-tcp  u$api")
	expect "$e" "libfabric provider tcp "
	expect "$e" "domain lo, FI_EP_MSG"
	expect "$e" "MR mode "
	expect "$e" "limits: transmit depth "
done
# datagram EPs (dgram=udp): a line for them; none on a connected entry
e=$(entry "$out" "rs-ofi-shmdg  u2.0")
expect "$e" "libfabric provider shm "
expect "$e" "datagrams: libfabric provider udp "
expect "$e" "DAT_IB_UD"
e=$(entry "$out" "rs-ofi-tcpdg  u2.0")
expect "$e" "dgram=udp: datagrams need an entry of reliable datagrams (FI_EP_RDM)"
e=$(entry "$out" "rs-ofi-none  u2.0")
expect "$e" "libfabric provider 'nosuchprov' offers no connected or reliable-datagram endpoint with sends, RDMA and send-after-send order: fi_getinfo: No data available"
# the entries make install registers: at least tcp on lo
expect "$("$top/build/bin/datinfo" --ofi-entries "$ofi_lib")" "rs-ofi-tcp	ofi tcp lo"
expect "$("$top/build/bin/datinfo" --ofi-entries "$ofi_lib")" "rs-ofi-tcp-rxm	ofi tcp;ofi_rxm lo"
expect "$("$top/build/bin/datinfo" --ofi-entries "$ofi_lib")" "rs-ofi-shm	ofi shm shm"
# A machine without libfabric (here: libfabric.so.1 hidden by an empty file in
# a mount namespace of our own): the ofi provider still loads (it opens
# libfabric at first use, docs/libfabric.md "Loading libfabric") and the entry
# says why it cannot open. Needs root for the namespace: said where not.
real=$(readlink -f "$(ldconfig -p | awk '/libfabric\.so\.1 .*x86-64/ {print $NF; exit}')" 2>/dev/null)
if [ -n "$real" ] && unshare -m true 2>/dev/null; then
	out=$(DAT_OVERRIDE="$conf" unshare -m sh -c "mount --bind /dev/null '$real' && exec '$top/build/bin/datinfo'" 2>&1)
	e=$(entry "$out" "rs-ofi-tcp  u2.0")
	expect "$e" "the provider refused to open it: DAT_PROVIDER_NOT_FOUND"
	expect "$e" "cannot open libfabric.so.1: "
	reject "$e" "panicked"
else
	echo "datinfo-check: NOTE: no libfabric.so.1 to hide or no mount namespace here: the case without libfabric is not run"
fi
echo "datinfo-check: $passed passed, $failed failed"
