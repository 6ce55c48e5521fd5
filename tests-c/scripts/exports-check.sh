#!/usr/bin/env bash
# Our libdat2.so.2 against OFED's (Debian's libdapl2): same soname, every
# OFED export present with symbol version DAT_2.0, the ten functions OFED
# declares but never exported present too, nothing else exported, and no
# dependency on the RDMA libraries (the registry is provider-agnostic).
# Our libdat.so.1 (DAT 1.2) against its header: exactly the functions
# include/dat/dat_api.h declares, each dat_x@@DAT_1.2, nothing else global,
# and no dependency beyond the C runtime libdat2 has too.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
ours="$top/build/lib/libdat2.so.2"
theirs=$(ldconfig -p | awk '/libdat2.so.2 / {print $NF; exit}')
passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "exports-check: $*"; }

soname=$(objdump -p "$ours" | awk '/SONAME/ {print $2}')
[ "$soname" = libdat2.so.2 ] && ok || bad "soname is '$soname'"

defined() { nm -D --defined-only "$1" | awk '$2 == "T" {print $3}' | sort; }
defined "$ours" > /tmp/exports-ours.$$
if [ -n "$theirs" ]; then
	n=0
	for sym in $(defined "$theirs"); do
		n=$((n + 1))
		grep -qx "$sym" /tmp/exports-ours.$$ && ok || bad "OFED export $sym missing"
	done
	[ $n -eq 74 ] && ok || bad "OFED's libdat2 has $n exports, expected 74"
else
	bad "OFED's libdat2.so.2 not installed (libdapl2)"
fi
for sym in dat_csp_create dat_csp_query dat_csp_free dat_ep_common_connect dat_ep_post_send_with_invalidate \
	dat_ep_post_rdma_read_to_rmr dat_rmr_create_for_ep dat_cno_fd_create dat_cno_trigger dat_registry_providers_related; do
	grep -qx "$sym@@DAT_2.0" /tmp/exports-ours.$$ && ok || bad "$sym missing"
done
total=$(wc -l < /tmp/exports-ours.$$)
unversioned=$(grep -vc '@@DAT_2.0$' /tmp/exports-ours.$$)
[ "$total" -eq 84 ] && ok || bad "$total exports, expected 84"
[ "$unversioned" -eq 0 ] && ok || bad "$unversioned exports without DAT_2.0: $(grep -v '@@DAT_2.0$' /tmp/exports-ours.$$ | head)"
rm -f /tmp/exports-ours.$$

if ldd "$ours" | grep -Eq 'libibverbs|librdmacm'; then bad "libdat2 depends on RDMA libraries"; else ok; fi

ours12="$top/build/lib/libdat.so.1"
soname=$(objdump -p "$ours12" | awk '/SONAME/ {print $2}')
[ "$soname" = libdat.so.1 ] && ok || bad "libdat.so.1: soname is '$soname'"
[ "$(readlink "$top/build/lib/libdat.so")" = libdat.so.1 ] && ok || bad "build/lib/libdat.so does not link to libdat.so.1"
# Every defined dynamic symbol but the version node's own (type A).
nm -D --defined-only "$ours12" | awk '$2 != "A" {print $3}' | sort > /tmp/exports-ours12.$$
grep -o '^DAT_RETURN dat_[a-z_]*' "$top/include/dat/dat_api.h" | awk '{print $2 "@@DAT_1.2"}' | sort > /tmp/exports-want12.$$
n=$(wc -l < /tmp/exports-want12.$$)
[ "$n" -eq 72 ] && ok || bad "include/dat/dat_api.h declares $n functions, expected 72"
extra=$(comm -23 /tmp/exports-ours12.$$ /tmp/exports-want12.$$)
missing=$(comm -13 /tmp/exports-ours12.$$ /tmp/exports-want12.$$)
[ -z "$missing" ] && ok || bad "libdat.so.1 lacks: $(echo $missing)"
[ -z "$extra" ] && ok || bad "libdat.so.1 also exports: $(echo $extra | head -c 600)"
nm -D --defined-only "$ours12" | awk '$2 == "T" && $3 ~ /@@DAT_1.2$/' | wc -l | grep -qx 72 && ok || bad "libdat.so.1: not 72 functions in DAT_1.2"
needed=$(objdump -p "$ours12" | awk '/NEEDED/ {print $2}' | grep -Ev '^(libc\.so\.6|libdl\.so\.2|libpthread\.so\.0|libgcc_s\.so\.1|ld-linux-x86-64\.so\.2)$')
[ -z "$needed" ] && ok || bad "libdat.so.1 depends on: $(echo $needed)"
rm -f /tmp/exports-ours12.$$ /tmp/exports-want12.$$
echo "exports-check: $passed passed, $failed failed"
