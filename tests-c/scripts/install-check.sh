#!/usr/bin/env bash
# `make install` and `make uninstall` as a packager runs them, into a DESTDIR
# that already holds Debian's /etc/dat.conf (package libdapl2: OFED's
# entries, no trailing newline):
#  - the files land under DESTDIR/usr/local (both registries, libdat2.so.2
#    and libdat.so.1, both header trees, dat2.pc and dat.pc), dat.conf keeps
#    every byte it had and gains our u2.0 and u1.2 entries (by installed
#    path; rs-tcp on lo and rs-tcp-<interface> on each other interface with
#    an IPv4 address) in a marked block;
#  - a DAT 2.0 consumer and a DAT 1.2 consumer build with pkg-config (dat2,
#    dat) against the installed tree;
#  - in a mount namespace that shows the installed tree where it will live
#    (DESTDIR/usr/local over /usr/local, its dat.conf over /etc/dat.conf, a
#    loader cache built there), with no LD_LIBRARY_PATH or DAT_OVERRIDE,
#    Debian's unmodified dapltest loads our libdat2.so.2 and our provider
#    through /etc/dat.conf and passes an FFT suite, and both consumers run
#    (the 1.2 one on the installed libdat.so.1 and provider), and man(1)
#    finds the installed pages (man/: a call of each API, dat.conf(5),
#    datinfo(1), daplrs(7));
#  - uninstall removes every file it installed and leaves dat.conf byte for
#    byte as it was.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/udapl-rs-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root
passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "install-check: FAIL: $*"; }
summary() {
	echo "install-check: $passed passed, $failed failed"
	[ $failed -eq 0 ]
	exit
}

if [ ! -s /etc/dat.conf ]; then
	bad "no Debian /etc/dat.conf to start from (package libdapl2)"
	summary
fi
mkdir -p "$root/etc"
cp /etc/dat.conf "$root/etc/dat.conf"
cp /etc/dat.conf "$work/dat.conf.before"

if ! make -s -C "$top" install DESTDIR="$root" PREFIX=/usr/local > "$work/install.log" 2>&1; then
	bad "make install failed: $(tail -3 "$work/install.log")"
	summary
fi
grep -q ldconfig "$work/install.log" && bad "ldconfig ran for a DESTDIR install" || ok
for f in lib/libdat2.so.2 lib/libdat2.so lib/libdaplrs.so.2 lib/libdaplrs-verbs.so.2 lib/libdaplrs-ofi.so.2 bin/datinfo \
	include/dat2/udat.h include/dat2/dat_types.h include/dat2/dat_ib_extensions.h lib/pkgconfig/dat2.pc \
	lib/libdat.so.1 lib/libdat.so include/dat/udat.h include/dat/dat_types.h include/dat/dat_api.h \
	lib/pkgconfig/dat.pc; do
	[ -e "$root/usr/local/$f" ] && ok || bad "missing /usr/local/$f"
done
[ "$(readlink "$root/usr/local/lib/libdat2.so")" = libdat2.so.2 ] && ok || bad "libdat2.so is not a link to libdat2.so.2"
[ "$(readlink "$root/usr/local/lib/libdat.so")" = libdat.so.1 ] && ok || bad "libdat.so is not a link to libdat.so.1"

# dat.conf: the old bytes first, unchanged, then our block
before=$(wc -c < "$work/dat.conf.before")
cmp -s -n "$before" "$work/dat.conf.before" "$root/etc/dat.conf" && ok || bad "dat.conf's existing bytes changed"
grep -q '^rs-tcp u2.0 nonthreadsafe default /usr/local/lib/libdaplrs.so.2 dapl.2.0 "tcp lo" ""$' "$root/etc/dat.conf" &&
	ok || bad "no rs-tcp u2.0 entry by installed path in dat.conf"
grep -q '^rs-tcp u1.2 nonthreadsafe default /usr/local/lib/libdaplrs.so.2 dapl.1.2 "tcp lo" ""$' "$root/etc/dat.conf" &&
	ok || bad "no rs-tcp u1.2 entry by installed path in dat.conf"
for api in 2.0 1.2; do
	grep -q "^rs-tcp u$api threadsafe default /usr/local/lib/libdaplrs.so.2 dapl.$api \"tcp lo\" \"\"\$" "$root/etc/dat.conf" &&
		ok || bad "no threadsafe rs-tcp u$api entry in dat.conf"
done
# rs-tcp on every other interface with an IPv4 address, as rs-tcp-<interface>
for i in $(ip -o -4 addr show 2>/dev/null | awk '$2 != "lo" { sub(/@.*/, "", $2); print $2 }' | sort -u); do
	grep -q "^rs-tcp-$i u2.0 nonthreadsafe default /usr/local/lib/libdaplrs.so.2 dapl.2.0 \"tcp $i\" \"\"\$" "$root/etc/dat.conf" &&
		ok || bad "no rs-tcp-$i entry (\"tcp $i\") in dat.conf"
done
# libfabric's tcp on lo (fi_info lists it wherever libfabric is installed): rs-ofi-tcp
for api in 2.0 1.2; do for ts in nonthreadsafe threadsafe; do
	grep -q "^rs-ofi-tcp u$api $ts default /usr/local/lib/libdaplrs-ofi.so.2 dapl.$api \"ofi tcp lo\" \"\"\$" "$root/etc/dat.conf" &&
		ok || bad "no $ts rs-ofi-tcp u$api entry (\"ofi tcp lo\") in dat.conf"
	# and tcp with ofi_rxm (FI_EP_RDM, our connection layer) on lo: rs-ofi-tcp-rxm
	grep -q "^rs-ofi-tcp-rxm u$api $ts default /usr/local/lib/libdaplrs-ofi.so.2 dapl.$api \"ofi tcp;ofi_rxm lo\" \"\"\$" "$root/etc/dat.conf" &&
		ok || bad "no $ts rs-ofi-tcp-rxm u$api entry (\"ofi tcp;ofi_rxm lo\") in dat.conf"
	# and shm (FI_EP_RDM, one host): rs-ofi-shm
	grep -q "^rs-ofi-shm u$api $ts default /usr/local/lib/libdaplrs-ofi.so.2 dapl.$api \"ofi shm shm\" \"\"\$" "$root/etc/dat.conf" &&
		ok || bad "no $ts rs-ofi-shm u$api entry (\"ofi shm shm\") in dat.conf"
done; done
[ "$(grep -c '^ofa-v2-' "$root/etc/dat.conf")" = "$(grep -c '^ofa-v2-' "$work/dat.conf.before")" ] &&
	ok || bad "OFED's entries were not all kept"
# installing again replaces the block, does not add a second
make -s -C "$top" install DESTDIR="$root" PREFIX=/usr/local > /dev/null 2>&1
[ "$(grep -c '^rs-tcp u2.0 ' "$root/etc/dat.conf")" = 2 ] && [ "$(grep -c '^rs-tcp u1.2 ' "$root/etc/dat.conf")" = 2 ] &&
	ok || bad "a second install added a second block"

# a consumer, built with pkg-config against the installed tree (and once
# more with -DDAT_THREADSAFE=DAT_TRUE: it must find the threadsafe entry,
# and the IA must say it is thread-safe)
cat > "$work/consumer.c" <<'C'
#include <dat2/udat.h>
#include <dat2/dat_ib_extensions.h>
#include <string.h>
int main(void)
{
	DAT_IA_HANDLE ia;
	DAT_EVD_HANDLE evd = DAT_HANDLE_NULL;
	DAT_RETURN rc = dat_ia_open("rs-tcp", 8, &evd, &ia);
	if (rc != DAT_SUCCESS)
		return 1;
	DAT_IA_ATTR attr;
	DAT_PROVIDER_ATTR pattr;
	rc = dat_ia_query(ia, &evd, DAT_IA_FIELD_ALL, &attr, DAT_PROVIDER_FIELD_ALL, &pattr);
	if (rc != DAT_SUCCESS || attr.extension_supported != DAT_EXTENSION_IB ||
	    pattr.is_thread_safe != DAT_THREADSAFE)
		return 2;
	return dat_ia_close(ia, DAT_CLOSE_GRACEFUL_FLAG) != DAT_SUCCESS;
}
C
if cc "$work/consumer.c" -o "$work/consumer" \
	$(PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_LIBDIR="$root/usr/local/lib/pkgconfig" pkg-config --cflags --libs dat2) \
	2> "$work/cc.log" &&
	cc -DDAT_THREADSAFE=DAT_TRUE "$work/consumer.c" -o "$work/consumer-ts" \
	$(PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_LIBDIR="$root/usr/local/lib/pkgconfig" pkg-config --cflags --libs dat2) \
	2>> "$work/cc.log"; then
	ok
else
	bad "consumer does not build with pkg-config: $(head -3 "$work/cc.log")"
fi

# a DAT 1.2 consumer (<dat/udat.h>, -ldat), built the same way with dat.pc:
# opens rs-tcp through its u1.2 entry, checks the IA's address, registers
# memory with the 11-argument dat_lmr_create
cat > "$work/consumer12.c" <<'C'
#include <dat/udat.h>
#include <netinet/in.h>
#include <string.h>
int main(void)
{
	static char buf[4096];
	DAT_IA_HANDLE ia;
	DAT_EVD_HANDLE evd = DAT_HANDLE_NULL;
	DAT_PZ_HANDLE pz;
	DAT_LMR_HANDLE lmr;
	DAT_LMR_CONTEXT lctx;
	DAT_RMR_CONTEXT rctx;
	DAT_VLEN len;
	DAT_VADDR addr;
	DAT_REGION_DESCRIPTION region;
	DAT_IA_ATTR attr;
	if (dat_ia_open("rs-tcp", 8, &evd, &ia) != DAT_SUCCESS)
		return 1;
	if (dat_ia_query(ia, &evd, DAT_IA_FIELD_ALL, &attr, 0, NULL) != DAT_SUCCESS ||
	    attr.ia_address_ptr->sa_family != AF_INET ||
	    ((struct sockaddr_in *)attr.ia_address_ptr)->sin_addr.s_addr != htonl(INADDR_LOOPBACK))
		return 2;
	region.for_va = buf;
	if (dat_pz_create(ia, &pz) != DAT_SUCCESS ||
	    dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, region, sizeof(buf), pz, DAT_MEM_PRIV_ALL_FLAG, &lmr, &lctx,
			   &rctx, &len, &addr) != DAT_SUCCESS ||
	    len < sizeof(buf) || dat_lmr_free(lmr) != DAT_SUCCESS || dat_pz_free(pz) != DAT_SUCCESS)
		return 3;
	return dat_ia_close(ia, DAT_CLOSE_GRACEFUL_FLAG) != DAT_SUCCESS;
}
C
if cc "$work/consumer12.c" -o "$work/consumer12" \
	$(PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_LIBDIR="$root/usr/local/lib/pkgconfig" pkg-config --cflags --libs dat) \
	2> "$work/cc12.log"; then
	ok
else
	bad "DAT 1.2 consumer does not build with pkg-config dat: $(head -3 "$work/cc12.log")"
fi

# the installed tree where it will live, in a private mount namespace
cat > "$work/inside.sh" <<EOF
set -u
mount --bind "$root/usr/local" /usr/local || exit 10
mount --bind "$root/etc/dat.conf" /etc/dat.conf || exit 11
ldconfig -X -C "$work/ld.so.cache" || exit 12
mount --bind "$work/ld.so.cache" /etc/ld.so.cache || exit 13
unset LD_LIBRARY_PATH DAT_OVERRIDE
echo "ldd: \$(ldd /usr/bin/dapltest | grep libdat2)"
timeout 120 dapltest -T F -D rs-tcp -f hwconn
echo "dapltest exit \$?"
timeout 60 "$work/consumer"
echo "consumer exit \$?"
timeout 60 "$work/consumer-ts"
echo "consumer-ts exit \$?"
echo "ldd12: \$(ldd "$work/consumer12" | grep 'libdat\.so')"
timeout 60 "$work/consumer12"
echo "consumer12 exit \$?"
info=\$(timeout 60 /usr/local/bin/datinfo rs-tcp 2>&1)
echo "datinfo: \$(grep -c 'IA address 127.0.0.1' <<<"\$info")"
echo "datinfo12: \$(grep -c 'DAT 1.2 entry, opened through /usr/local/lib/libdat.so.1' <<<"\$info")"
for page in dat_ep_post_rdma_read dat_rmr_bind 5:dat.conf 1:datinfo 7:daplrs; do
	sec=\${page%%:*}; name=\${page#*:}; [ "\$sec" = "\$page" ] && sec=3
	echo "man \$sec \$name: \$(MANPAGER=cat MANWIDTH=80 man -M /usr/local/share/man "\$sec" "\$name" 2>/dev/null | grep -c .)"
done
EOF
unshare -m bash "$work/inside.sh" > "$work/inside.log" 2>&1
grep -q 'ldd:.*/usr/local/lib/libdat2.so.2' "$work/inside.log" && ok ||
	bad "dapltest did not load the installed libdat2 ($(grep 'ldd:' "$work/inside.log"); see below)"
n=$(grep -c '^Result: *PASS' "$work/inside.log")
if [ "$n" -gt 0 ] && ! grep -q '^Result: *FAIL' "$work/inside.log" && grep -q 'dapltest exit 0' "$work/inside.log"; then
	ok
else
	bad "Debian's dapltest FFT hwconn through the installed tree: $n PASS"
	sed 's/^/    /' "$work/inside.log" | tail -20
fi
grep -q 'consumer exit 0' "$work/inside.log" && ok || bad "the pkg-config consumer failed in the installed tree"
grep -q 'consumer-ts exit 0' "$work/inside.log" && ok ||
	bad "the DAT_THREADSAFE consumer failed in the installed tree ($(grep 'consumer-ts exit' "$work/inside.log"))"
grep -q 'ldd12:.*/usr/local/lib/libdat.so.1' "$work/inside.log" && ok ||
	bad "the DAT 1.2 consumer did not load the installed libdat.so.1 ($(grep 'ldd12:' "$work/inside.log"))"
grep -q 'consumer12 exit 0' "$work/inside.log" && ok ||
	bad "the DAT 1.2 consumer failed in the installed tree ($(grep 'consumer12 exit' "$work/inside.log"))"
# (datinfo shows every entry named rs-tcp: the u2.0 one and the u1.2 one)
grep -Eq 'datinfo: [1-9]' "$work/inside.log" && ok || bad "installed datinfo did not open rs-tcp"
# (its u1.2 entries as DAT 1.2 ones, through the installed libdat.so.1)
grep -Eq 'datinfo12: [1-9]' "$work/inside.log" && ok ||
	bad "installed datinfo did not open rs-tcp's u1.2 entries through the installed libdat.so.1"

# (man finds the installed pages: a section 3 page of each API, dat.conf(5), datinfo(1),
# daplrs(7))
for page in "3 dat_ep_post_rdma_read" "3 dat_rmr_bind" "5 dat.conf" "1 datinfo" "7 daplrs"; do
	grep -Eq "^man $page: [1-9]" "$work/inside.log" && ok || bad "man $page: no page in the installed tree"
done

# uninstall: our files gone, dat.conf as it was
make -s -C "$top" uninstall DESTDIR="$root" PREFIX=/usr/local > "$work/uninstall.log" 2>&1 || bad "make uninstall failed"
cmp -s "$work/dat.conf.before" "$root/etc/dat.conf" && ok || bad "dat.conf not restored byte for byte"
left=$(cd "$root" && find . -type f ! -path ./etc/dat.conf | sort)
[ -z "$left" ] && ok || bad "left after uninstall: $left"
summary
