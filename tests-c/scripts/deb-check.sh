#!/usr/bin/env bash
# udapl-rs's Debian packages (make deb: build/deb/*.deb) as a site installs
# them, in a throw-away Debian 12 root made here, never on this machine's
# own system:
#  - a minimal bookworm made by debootstrap (its packages are kept in
#    build/deb-check/bookworm.tgz, so that only the first run needs
#    Debian's mirror) with Debian's libdapl2 (OFED's registry, providers and
#    /etc/dat.conf) and dapl2-utils (dapltest, dtest) installed first;
#  - dpkg installs every package of ours in it: libdapl2's libdat2.so.2 is
#    diverted (dat-ofed/), ours is the one the loader finds, even after
#    ldconfig and a reinstall of libdapl2; /etc/dat.conf keeps every byte it
#    had (OFED's entries) and gains our block: rs-tcp on lo,
#    rs-tcp-<interface> on an interface with an IPv4 address, libfabric's
#    entries;
#  - with no environment at all (env -i), Debian's dapltest server and
#    client run over rs-tcp through /etc/dat.conf (and over
#    rs-tcp-<interface>), dtest too, datinfo opens the u2.0 and u1.2
#    entries, man finds our pages;
#  - a user's line outside the block survives a reinstall (an upgrade's
#    scripts); removing one provider takes exactly its entries;
#  - purging ours leaves /etc/dat.conf byte for byte as it was, the
#    diversions gone and libdapl2's files back and intact;
#  - without libdapl2 (purged), ours create /etc/dat.conf and purging them
#    removes it;
#  - the TCP provider's package depends on neither rdma-core nor libfabric,
#    the verbs one on rdma-core's libraries, only the libfabric one on
#    libfabric1.
# Everything after the root is made runs in private mount, network and pid
# namespaces (unshare): the chroot's mounts never show outside, the
# servers listen in a network of their own (lo and a veth pair), and no
# process outlives the test; every server runs under `timeout` and is
# waited for by its readiness line. The root is removed at the end.
#
# Usage: deb-check.sh [DEB_DIR]   (default build/deb; needs root)
# DEB_CHECK_KEEP=1 keeps the root and the logs (the path is printed).
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
# (what tests-c's runner sets for the build tree means nothing here)
unset LD_LIBRARY_PATH DAT_OVERRIDE

if [ "${1:-}" = --inside ]; then
	inside=1 work=$2
else
	inside=""
	debs=$(cd "${1:-$top/build/deb}" 2>/dev/null && pwd)
fi
. "$top/tests-c/scripts/bookworm-root.sh"
conf_name=deb-check
ia=rs-tcp addr=127.0.0.1

# ------------------------------------------------------------ outside
if [ -z "$inside" ]; then
	passed=0 failed=0
	summary() {
		echo "deb-check: $passed passed, $failed failed"
		[ $failed -eq 0 ]
		exit
	}
	if [ "$(id -u)" != 0 ]; then
		echo "deb-check: FAIL: needs root (debootstrap, chroot, unshare)"
		failed=1
		summary
	fi
	if [ -z "$debs" ] || ! ls "$debs"/libdat2-2-rs_*.deb > /dev/null 2>&1; then
		echo "deb-check: FAIL: no packages in ${1:-$top/build/deb} (make deb)"
		failed=1
		summary
	fi
	# The TCP provider needs neither rdma-core nor libfabric; only the
	# libfabric provider pulls libfabric in.
	for p in libdaplrs2 libdat2-2-rs libdat1-rs udapl-rs-utils libdaplrs-verbs2 libdaplrs-ofi2; do
		deps=$(dpkg-deb -f "$debs/${p}"_*.deb Depends 2>/dev/null)
		case "$p:$deps" in
		libdaplrs-ofi2:*libfabric1*) passed=$((passed + 1)) ;;
		libdaplrs-ofi2:*) echo "deb-check: FAIL: libdaplrs-ofi2 does not depend on libfabric1"; failed=$((failed + 1)) ;;
		*:*libfabric*) echo "deb-check: FAIL: $p depends on libfabric: $deps"; failed=$((failed + 1)) ;;
		libdaplrs-verbs2:*libibverbs1*librdmacm1*) passed=$((passed + 1)) ;;
		libdaplrs-verbs2:*) echo "deb-check: FAIL: libdaplrs-verbs2 does not depend on rdma-core's libraries"; failed=$((failed + 1)) ;;
		*:*libibverbs*|*:*librdmacm*) echo "deb-check: FAIL: $p depends on rdma-core: $deps"; failed=$((failed + 1)) ;;
		*) passed=$((passed + 1)) ;;
		esac
	done
	work=$(mktemp -d /tmp/udapl-rs-deb-check.XXXXXX)
	root=$work/root
	# The root is removed from this (the host's) mount namespace, where
	# nothing is mounted in it: the mounts were made in the test's own.
	cleanup() {
		if [ -n "${DEB_CHECK_KEEP:-}" ]; then
			echo "deb-check: kept $work (DEB_CHECK_KEEP)"
		elif findmnt -rno TARGET | grep -q "^$root"; then
			echo "deb-check: something is mounted under $root: not removing $work" >&2
		else
			rm -rf "$work"
		fi
	}
	trap cleanup EXIT
	if ! why=$(bookworm_root "$root" "$work" "$work/dl"); then
		echo "deb-check: FAIL: $why"
		failed=1
		summary
	fi
	mkdir -p "$root/debs"
	cp "$debs"/*.deb "$root/debs/"
	rm -f "$root"/debs/*-dbgsym_*.deb
	DEB_CHECK_COUNTS="$passed $failed" unshare --mount --net --pid --fork --mount-proc bash "$0" --inside "$work"
	rc=$?
	if [ $rc -ne 0 ] && [ $rc -ne 1 ]; then
		echo "deb-check: FAIL: the test's namespace ended with status $rc, before its summary"
		failed=$((failed + 1))
		summary
	fi
	exit $rc
fi

# ------------------------------------------------------------- inside
# Private mount, network and pid namespaces (unshare above).
root=$work/root
out=$work/logs
mkdir -p "$out"
# ok, bad, start_server, finish_server, stop_server, dtest_pair
. "$top/tests-c/scripts/conformance-lib.sh"
read -r passed failed <<< "${DEB_CHECK_COUNTS:-0 0}"
summary() {
	echo "deb-check: $passed passed, $failed failed"
	[ $failed -eq 0 ]
	exit
}
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
libdir=/usr/lib/$multiarch

# A network of our own: lo, and a veth pair whose first end has an IPv4
# address of a documentation range (the IA of rs-tcp-udrs0).
ip link set lo up
ip link add udrs0 type veth peer name udrs1 && ip addr add 198.51.100.1/24 dev udrs0 &&
	ip link set udrs0 up && ip link set udrs1 up || bad "no veth pair for rs-tcp-<interface>"
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys" 2>/dev/null || mount --bind -o ro /sys "$root/sys"
mkdir -p "$root/dev/shm"
mount -t tmpfs tmpfs "$root/dev/shm"
mount -t tmpfs tmpfs "$root/tmp"

# Commands in the root with no environment but a PATH.
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }

# the root as Debian left it
in_root dpkg -s libdapl2 dapl2-utils > /dev/null 2>&1 && ok || bad "libdapl2 and dapl2-utils are not installed in the root"
cp "$root/etc/dat.conf" "$work/dat.conf.before"
[ -s "$work/dat.conf.before" ] && ok || bad "the root has no Debian /etc/dat.conf"
ofed_lib=$(readlink -f "$root$libdir/libdat2.so.2")
ofed_sum=$(md5sum < "$ofed_lib")

# ------------------------------------------------------------ install
ours=$(cd "$root/debs" && ls *.deb | sed 's/_.*//' | sort -u | tr '\n' ' ')
if in_root sh -c 'dpkg -i /debs/*.deb' > "$out/install.log" 2>&1; then ok; else
	bad "dpkg -i of our packages: $(grep -m3 -i 'error\|fail' "$out/install.log")"
	summary
fi
for p in $ours; do
	[ "$(in_root dpkg-query -W -f '${Status}' "$p" 2>/dev/null)" = "install ok installed" ] && ok ||
		bad "$p is not installed"
done
in_root dpkg --audit > "$out/audit.log" 2>&1 && [ ! -s "$out/audit.log" ] && ok || bad "dpkg --audit: $(head -3 "$out/audit.log")"

# the diversion: ours at libdat2.so.2, OFED's in dat-ofed/, also after
# ldconfig (which any library's install runs) and a reinstall of libdapl2
check_registry() {
	local when=$1
	in_root dpkg --verify libdat2-2-rs > "$out/verify.log" 2>&1 && ok ||
		bad "$when: libdat2-2-rs's files are not ours on disk: $(head -2 "$out/verify.log")"
	[ "$(readlink -f "$root$libdir/libdat2.so.2")" = "$root$libdir/libdat2.so.2.0.0" ] && ok ||
		bad "$when: libdat2.so.2 points at $(readlink -f "$root$libdir/libdat2.so.2")"
	[ "$(md5sum < "$root$libdir/dat-ofed/libdat2.so.2.0.0" 2>/dev/null)" = "$ofed_sum" ] && ok ||
		bad "$when: OFED's libdat2.so.2.0.0 is not in dat-ofed/"
	in_root ldd /usr/bin/dapltest > "$out/ldd.log" 2>&1
	grep -q "libdat2.so.2 => $libdir/libdat2.so.2 " "$out/ldd.log" ||
		grep -q "libdat2.so.2 => /lib/$multiarch/libdat2.so.2 " "$out/ldd.log" && ok ||
		bad "$when: dapltest loads $(grep libdat2 "$out/ldd.log")"
}
check_registry "installed"
n=$(in_root dpkg-divert --list | grep -c 'by libdat2-2-rs$')
[ "$n" = 2 ] && ok || bad "$n diversions by libdat2-2-rs, not 2"
in_root dpkg-divert --list | grep -q "dat.conf.5.gz to /usr/share/man/man5/dat.conf.ofed.5.gz by udapl-rs-utils" && ok ||
	bad "dapl2-utils's dat.conf(5) is not diverted"
in_root ldconfig
check_registry "after ldconfig"
ofed_deb=$(ls "$root"/var/cache/apt/archives/libdapl2_*.deb 2>/dev/null | head -1)
if [ -n "$ofed_deb" ]; then
	if in_root dpkg -i "/var/cache/apt/archives/${ofed_deb##*/}" > "$out/reinstall-libdapl2.log" 2>&1; then
		ok
		check_registry "after libdapl2's reinstall"
	else
		bad "reinstalling libdapl2 over ours: $(tail -2 "$out/reinstall-libdapl2.log")"
	fi
else
	echo "deb-check: libdapl2's .deb is not in the root's apt cache: its reinstall not checked"
fi

# dat.conf: the old bytes first, unchanged, then our block
conf=$root/etc/dat.conf
size=$(wc -c < "$work/dat.conf.before")
cmp -s -n "$size" "$work/dat.conf.before" "$conf" && ok || bad "dat.conf's existing bytes changed"
[ "$(grep -c '^ofa-v2-' "$conf")" = "$(grep -c '^ofa-v2-' "$work/dat.conf.before")" ] && ok ||
	bad "OFED's entries were not all kept"
[ "$(grep -c '^# BEGIN udapl-rs providers (Debian packages)' "$conf")" = 1 ] && ok || bad "not one block of ours in dat.conf"
entry() { # NAME LIBRARY PARAMS: all four entries present
	local api ts
	for api in 2.0 1.2; do for ts in nonthreadsafe threadsafe; do
		grep -qxF "$1 u$api $ts default $2 dapl.$api \"$3\" \"\"" "$conf" || return 1
	done; done
}
entry rs-tcp libdaplrs.so.2 "tcp lo" && ok || bad "no rs-tcp entries in dat.conf"
entry rs-tcp-udrs0 libdaplrs.so.2 "tcp udrs0" && ok || bad "no rs-tcp-udrs0 entries (an interface with an IPv4 address)"
entry rs-ofi-tcp libdaplrs-ofi.so.2 "ofi tcp lo" && ok || bad "no rs-ofi-tcp entries (datinfo --ofi-entries)"
entry rs-ofi-shm libdaplrs-ofi.so.2 "ofi shm shm" && ok || bad "no rs-ofi-shm entries (datinfo --ofi-entries)"
cp "$conf" "$out/dat.conf.installed"

# ------------------------------------------------- programs, no environment
if start_server "$out/dapltest-server.log" "Service Point Ready" in_root timeout 120 dapltest -T S -D rs-tcp; then
	client in_root T-SR dapltest -T T -s 127.0.0.1 -D rs-tcp -i 100 -t 1 -w 1 client SR 256 server SR 256
	client in_root Q dapltest -T Q -s 127.0.0.1 -D rs-tcp
	if finish_server 20; then ok; else bad "dapltest server (rs-tcp) exit status (see $out/dapltest-server.log)"; fi
fi
if start_server "$out/dapltest-server-udrs0.log" "Service Point Ready" in_root timeout 120 dapltest -T S -D rs-tcp-udrs0; then
	client in_root T-SR-udrs0 dapltest -T T -s 198.51.100.1 -D rs-tcp-udrs0 -i 100 -t 1 -w 1 client SR 256 server SR 256
	client in_root Q-udrs0 dapltest -T Q -s 198.51.100.1 -D rs-tcp-udrs0
	if finish_server 20; then ok; else bad "dapltest server (rs-tcp-udrs0) exit status (see $out/dapltest-server-udrs0.log)"; fi
fi
dtest_pair in_root dtest "waiting for client connection" 15828 'FAILED|ERROR' "" dtest
# datinfo opens rs-tcp's u2.0 entries through our libdat2, its u1.2 ones
# through our libdat.so.1
in_root timeout 60 datinfo rs-tcp > "$out/datinfo.log" 2>&1
grep -q 'IA address 127.0.0.1' "$out/datinfo.log" && ok || bad "datinfo did not open rs-tcp (see $out/datinfo.log)"
grep -q "DAT 1.2 entry, opened through .*libdat.so.1" "$out/datinfo.log" && ok ||
	bad "datinfo did not open rs-tcp's u1.2 entries through libdat.so.1 (see $out/datinfo.log)"
# man: a call's page (libdat-rs-dev), dat.conf(5) ours and OFED's beside it
in_root man -w 3 dat_ep_post_rdma_read > /dev/null 2>&1 && ok || bad "man finds no dat_ep_post_rdma_read(3)"
in_root sh -c 'zcat "$(man -w 5 dat.conf)"' 2> /dev/null | grep -q udapl-rs && ok || bad "man 5 dat.conf is not ours"
in_root sh -c 'zcat "$(man -w 5 dat.conf.ofed)"' > "$out/dat.conf.ofed.5" 2> /dev/null
grep -q 'dat.conf' "$out/dat.conf.ofed.5" && ! grep -q udapl-rs "$out/dat.conf.ofed.5" && ok ||
	bad "man 5 dat.conf.ofed is not dapl2-utils' page"

# --------------------------------------------- a user's line, an upgrade
printf 'user-ia u2.0 nonthreadsafe default libdaplrs.so.2 dapl.2.0 "tcp lo" ""\n' >> "$conf"
cp "$conf" "$out/dat.conf.user"
if in_root sh -c 'dpkg -i /debs/*.deb' > "$out/reinstall.log" 2>&1; then ok; else
	bad "dpkg -i again (upgrade path): $(grep -m3 -i 'error\|fail' "$out/reinstall.log")"
fi
cmp -s "$out/dat.conf.user" "$conf" && ok || bad "reinstalling changed dat.conf (a user's line, or our entries)"
sed -i '/^user-ia /d' "$conf"
check_registry "after our reinstall"

# removing one provider takes exactly its entries
if in_root dpkg -r libdaplrs-ofi2 > "$out/remove-ofi.log" 2>&1; then ok; else bad "dpkg -r libdaplrs-ofi2 failed"; fi
grep -v ' libdaplrs-ofi.so.2 \|^# libdaplrs-ofi2:\|^# (datinfo --ofi-entries' "$out/dat.conf.installed" | cmp -s - "$conf" && ok ||
	bad "removing libdaplrs-ofi2 changed more than its entries (diff in $out/remove-ofi.diff)"
diff "$out/dat.conf.installed" "$conf" > "$out/remove-ofi.diff"
entry rs-tcp libdaplrs.so.2 "tcp lo" && ok || bad "removing libdaplrs-ofi2 took rs-tcp's entries"

# ---------------------------------------------------------------- purge
if in_root sh -c "dpkg --purge $ours" > "$out/purge.log" 2>&1; then ok; else
	bad "dpkg --purge: $(grep -m3 -i 'error\|fail' "$out/purge.log")"
fi
cmp -s "$work/dat.conf.before" "$conf" && ok || {
	bad "dat.conf is not byte for byte as before (diff below)"
	diff "$work/dat.conf.before" "$conf" | head -20
}
n=$(in_root dpkg-divert --list | grep -c 'udapl-rs\|libdat2-2-rs')
[ "$n" = 0 ] && ok || bad "$n diversions of ours left after purge"
in_root dpkg --verify libdapl2 dapl2-utils > "$out/verify-ofed.log" 2>&1 && ok ||
	bad "libdapl2 or dapl2-utils is not intact after purge: $(head -3 "$out/verify-ofed.log")"
[ "$(md5sum < "$(readlink -f "$root$libdir/libdat2.so.2")")" = "$ofed_sum" ] && ok ||
	bad "libdat2.so.2 is not OFED's after purge"
[ ! -e "$root$libdir/dat-ofed" ] && [ ! -e "$root/var/lib/udapl-rs" ] && ok ||
	bad "left after purge: $(ls -d "$root$libdir/dat-ofed" "$root/var/lib/udapl-rs" 2>/dev/null)"
in_root dpkg -s libdapl2 dapl2-utils > /dev/null 2>&1 && ok || bad "libdapl2 or dapl2-utils is no longer installed"

# --------------------------------------------------- without libdapl2
# No /etc/dat.conf before ours: the providers create it, purging them
# removes it again.
in_root dpkg --purge dapl2-utils libdapl2 > "$out/purge-ofed.log" 2>&1 && [ ! -e "$conf" ] && ok ||
	bad "purging libdapl2 left /etc/dat.conf or failed (see $out/purge-ofed.log)"
if in_root sh -c 'dpkg -i /debs/*.deb' > "$out/install-alone.log" 2>&1; then ok; else
	bad "dpkg -i of ours without libdapl2: $(grep -m3 -i 'error\|fail' "$out/install-alone.log")"
fi
head -1 "$conf" 2>/dev/null | grep -qxF '# BEGIN udapl-rs providers (Debian packages) [created]' && ok ||
	bad "without libdapl2, dat.conf does not start with our block ($(head -1 "$conf" 2>&1))"
entry rs-tcp libdaplrs.so.2 "tcp lo" && ok || bad "without libdapl2: no rs-tcp entries"
in_root timeout 60 datinfo rs-tcp > "$out/datinfo-alone.log" 2>&1
grep -q 'IA address 127.0.0.1' "$out/datinfo-alone.log" && ok || bad "without libdapl2: datinfo did not open rs-tcp"
in_root sh -c "dpkg --purge $ours" > "$out/purge-alone.log" 2>&1 && ok || bad "dpkg --purge without libdapl2 failed"
[ ! -e "$conf" ] && ok || bad "purging ours left an /etc/dat.conf they had created"
n=$(in_root dpkg-divert --list | grep -c 'udapl-rs\|libdat2-2-rs')
[ "$n" = 0 ] && ok || bad "$n diversions of ours left after the second purge"
summary
