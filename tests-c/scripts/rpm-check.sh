#!/usr/bin/env bash
# udapl-rs's RPM packages (make rpm: build/rpm/*.rpm, redhat/udapl-rs.spec)
# inspected, then installed and erased by rpm in a throw-away root, never on
# this machine's own system:
#  - the seven packages are there, at the version of Cargo.toml; the TCP
#    provider, the registries, the devel and utils packages require neither
#    rdma-core nor libfabric, the verbs one rdma-core's libraries, only the
#    libfabric one libfabric; the registry, devel and utils packages
#    conflict with OFED's dapl, dapl-devel and dapl-utils, and the
#    registries provide the sonames at their symbol versions;
#  - each package's files (rpm -qpl, printed; less the build-id links
#    rpmbuild adds) are the files of its Debian package: what
#    debian/*.install gives that package (the Debian split, the RPMs'
#    /usr/lib64 for /usr/lib/<triplet>), and, where make deb's packages are
#    (build/deb, same version), exactly the files in them, less what is
#    Debian's own (/usr/share/doc, lintian overrides, the libdat2.so.2.0.0
#    name the diversion needs). rpmbuild itself fails on a file make
#    install installs that no package holds;
#  - each package's scriptlets (rpm -qp --scripts, printed): the providers
#    run scripts/datconf-register (installed in /usr/libexec/udapl-rs) with
#    -p rpm: add in %post, remove in %preun on erase only ($1 = 0), and
#    ldconfig; the registries run ldconfig; devel and utils have none;
#  - in a bookworm root made by debootstrap from deb-check.sh's tarball
#    (build/deb-check/bookworm.tgz; only a first run needs Debian's mirror),
#    with an rpm database initialised in it, Debian's libdapl2 purged but
#    its /etc/dat.conf (OFED's entries) kept as the site's file, and
#    /usr/lib64 on the loader's path as on an RPM distribution: rpm --root
#    installs the packages (--nodeps: the root's rpm database knows none of
#    Debian's libraries) and their scriptlets run in the root (chroot, its
#    /bin/sh); rpm -V finds every file as packaged; the installed scripts
#    are the tree's; ldconfig ran (the loader's cache has our libraries);
#    dat.conf keeps every byte it had and gains one block with rs-tcp on
#    lo, rs-tcp-<interface> on an interface with an IPv4 address and
#    libfabric's entries; datinfo opens rs-tcp's u2.0 entries through
#    libdat2.so.2 and its u1.2 ones through libdat.so.1, as a program would;
#  - an upgrade's scriptlets (rpm -U --replacepkgs: the new %post with
#    $1 = 2, the old %preun with $1 = 1) keep dat.conf byte for byte (the
#    block rewritten in place, a user's line after it kept); erasing one
#    provider takes exactly its entries; erasing them all (rpm orders
#    udapl-rs-utils last) leaves dat.conf byte for byte as it was, the
#    state directory gone and the loader's cache without our libraries;
#  - with no /etc/dat.conf before, the providers create it and erasing them
#    removes it;
#  - with stand-ins for dapl, dapl-devel and dapl-utils in the root's
#    database (empty packages, rpm --justdb), rpm refuses ours for the
#    three conflicts, and the providers' "udapl-rs-libdat2 or dapl" is met
#    by dapl (and missing with neither).
# What this does not cover: dnf's resolution on a real Fedora or RHEL
# (Requires, Recommends, the rich dependency against the distribution's
# own packages), SELinux, and Fedora's glibc ldconfig file trigger; the
# scriptlets run under dash (stricter than Fedora's bash as /bin/sh).
# Everything after the root is made runs in private mount, network and pid
# namespaces (unshare), with a veth pair whose first end has an IPv4
# address (the IA of rs-tcp-udrs0). The root is removed at the end.
#
# Usage: rpm-check.sh [RPM_DIR [DEB_DIR]]   (defaults build/rpm, build/deb;
# needs root). RPM_CHECK_KEEP=1 keeps the root and the logs.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
unset LD_LIBRARY_PATH DAT_OVERRIDE

if [ "${1:-}" = --inside ]; then
	inside=1 work=$2 rpms=$3
else
	inside=""
	rpms=$(cd "${1:-$top/build/rpm}" 2>/dev/null && pwd)
	debs=${2:-$top/build/deb}
fi
# deb-check.sh's root, from the same tarball.
. "$top/tests-c/scripts/bookworm-root.sh"
# Our packages, each with the Debian package whose files it holds.
pkgs="udapl-rs-libdat2 udapl-rs-libdat1 udapl-rs udapl-rs-verbs udapl-rs-ofi udapl-rs-devel udapl-rs-utils"
deb_of() {
	case $1 in
	udapl-rs-libdat2) echo libdat2-2-rs ;;
	udapl-rs-libdat1) echo libdat1-rs ;;
	udapl-rs) echo libdaplrs2 ;;
	udapl-rs-verbs) echo libdaplrs-verbs2 ;;
	udapl-rs-ofi) echo libdaplrs-ofi2 ;;
	udapl-rs-devel) echo libdat-rs-dev ;;
	udapl-rs-utils) echo udapl-rs-utils ;;
	esac
}

passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "rpm-check: FAIL: $*"; }
summary() {
	echo "rpm-check: $passed passed, $failed failed"
	[ $failed -eq 0 ]
	exit
}

# ------------------------------------------------------------ outside
if [ -z "$inside" ]; then
	if [ "$(id -u)" != 0 ]; then
		bad "needs root (debootstrap, chroot, unshare, rpm --root)"
		summary
	fi
	command -v rpm > /dev/null && command -v rpmbuild > /dev/null || {
		bad "no rpm and rpmbuild (make rpm installs them)"
		summary
	}
	work=$(mktemp -d /tmp/udapl-rs-rpm-check.XXXXXX)
	root=$work/root
	cleanup() {
		if [ -n "${RPM_CHECK_KEEP:-}" ]; then
			echo "rpm-check: kept $work (RPM_CHECK_KEEP)"
		elif findmnt -rno TARGET | grep -q "^$root"; then
			echo "rpm-check: something is mounted under $root: not removing $work" >&2
		else
			rm -rf "$work"
		fi
	}
	trap cleanup EXIT
	out=$work/logs
	mkdir -p "$out"

	# The packages, by the name each says it has.
	declare -A file_of
	for f in "${rpms:-/nonexistent}"/*.rpm; do
		[ -f "$f" ] || continue
		file_of[$(rpm -qp --qf '%{NAME}' "$f" 2> /dev/null)]=$f
	done
	for p in $pkgs; do
		[ -n "${file_of[$p]:-}" ] && ok || bad "no package $p in ${1:-$top/build/rpm} (make rpm)"
	done
	[ ${#file_of[@]} = 7 ] && ok || bad "${#file_of[@]} packages in $rpms, not 7: ${!file_of[*]}"
	[ -n "${file_of[udapl-rs-libdat2]:-}" ] || summary
	version=$(rpm -qp --qf '%{VERSION}' "${file_of[udapl-rs-libdat2]}" 2> /dev/null)
	release=$(rpm -qp --qf '%{VERSION}-%{RELEASE}' "${file_of[udapl-rs-libdat2]}" 2> /dev/null)
	cargo_version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$top/Cargo.toml")
	[ "$version" = "$cargo_version" ] && ok || bad "the packages' version $version is not Cargo.toml's $cargo_version"

	# ------------------------------------------------- dependencies
	for p in $pkgs; do
		f=${file_of[$p]:-}
		[ -n "$f" ] || continue
		req=$(rpm -qp --requires "$f" 2> /dev/null | tr '\n' ' ')
		case "$p:$req" in
		udapl-rs-ofi:*libfabric*) ok ;;
		udapl-rs-ofi:*) bad "udapl-rs-ofi does not require libfabric" ;;
		*:*libfabric*) bad "$p requires libfabric: $req" ;;
		udapl-rs-verbs:*libibverbs.so.1*librdmacm.so.1*) ok ;;
		udapl-rs-verbs:*) bad "udapl-rs-verbs does not require rdma-core's libraries" ;;
		*:*libibverbs*|*:*librdmacm*) bad "$p requires rdma-core: $req" ;;
		*) ok ;;
		esac
		case $p in
		udapl-rs | udapl-rs-verbs | udapl-rs-ofi)
			# the registration script's package, when the scriptlets run
			for t in manual post preun; do
				rpm -qp --qf '[%{REQUIREFLAGS:deptype} %{REQUIRENAME} %{REQUIREVERSION}\n]' "$f" 2> /dev/null |
					grep -qx "$t udapl-rs-utils $release" && ok ||
					bad "$p does not require udapl-rs-utils = $release ($t)"
			done
			rpm -qp --requires "$f" 2> /dev/null | grep -q '^(udapl-rs-libdat2.* or dapl.*)$' && ok ||
				bad "$p does not require a DAT 2.0 registry (udapl-rs-libdat2 or dapl)"
			;;
		esac
	done
	for pc in udapl-rs-libdat2:dapl udapl-rs-devel:dapl-devel udapl-rs-utils:dapl-utils; do
		p=${pc%%:*} c=${pc#*:}
		rpm -qp --conflicts "${file_of[$p]:-/nonexistent}" 2> /dev/null | grep -qx "$c" && ok ||
			bad "$p does not conflict with $c"
	done
	for p in $pkgs; do
		rpm -qp --obsoletes "${file_of[$p]:-/nonexistent}" 2> /dev/null | grep -q . && bad "$p obsoletes something" || ok
	done
	rpm -qp --provides "${file_of[udapl-rs-libdat2]}" 2> /dev/null | grep -qx 'libdat2.so.2(DAT_2.0)(64bit)' && ok ||
		bad "udapl-rs-libdat2 does not provide libdat2.so.2(DAT_2.0)(64bit)"
	rpm -qp --provides "${file_of[udapl-rs-libdat1]:-/nonexistent}" 2> /dev/null | grep -qx 'libdat.so.1(DAT_1.2)(64bit)' && ok ||
		bad "udapl-rs-libdat1 does not provide libdat.so.1(DAT_1.2)(64bit)"

	# ------------------------------------------------------- files
	# Each package's files (no directories, no build-id links).
	files_of() {
		rpm -qp --qf '[%{FILEMODES:perms} %{FILENAMES}\n]' "${file_of[$1]}" 2> /dev/null |
			awk '$1 !~ /^d/ && $2 !~ /^\/usr\/lib\/\.build-id\// { print $2 }' | sort
	}
	for p in $pkgs; do
		[ -n "${file_of[$p]:-}" ] || continue
		files_of "$p" > "$out/$p.files"
		rpm -qpl "${file_of[$p]}" > "$out/$p.qpl" 2> /dev/null
		n3=$(grep -c '/man3/' "$out/$p.qpl")
		echo "rpm-check: rpm -qpl $p:"
		grep -v '/man3/' "$out/$p.qpl" | sed 's/^/    /'
		[ "$n3" -gt 0 ] && echo "    ... and $n3 pages in /usr/share/man/man3"
	done
	cat "$out"/*.files | sort > "$out/all.files"
	libdir=$(dirname "$(grep -m1 '/libdat2\.so\.2$' "$out/all.files")")
	[ "$libdir" = /usr/lib64 ] && ok || bad "libdat2.so.2 is in $libdir, not /usr/lib64"
	# What debian/*.install gives each Debian package, among the files the
	# RPMs hold: a path is the file, or the directory of the files under
	# it; "SOURCE DIR" is DIR/<SOURCE's name>. libdat2.so.2.0.0 is the
	# Debian packages' own (the name their diversion needs).
	for p in $pkgs; do
		d=$(deb_of "$p")
		: > "$out/$p.expected"
		while read -r a b; do
			[ -n "$a" ] || continue
			if [ -n "$b" ]; then
				path=/$b/${a##*/}
			else
				path=/$(printf '%s' "$a" | sed "s|usr/lib/\${DEB_HOST_MULTIARCH}|${libdir#/}|")
			fi
			[ "$path" = "$libdir/libdat2.so.2.0.0" ] && continue
			if grep -qxF "$path" "$out/all.files"; then
				echo "$path" >> "$out/$p.expected"
			elif grep -q "^$path/" "$out/all.files"; then
				grep "^$path/" "$out/all.files" >> "$out/$p.expected"
			else
				bad "$d's $path (debian/$d.install) is in no RPM"
			fi
		done < "$top/debian/$d.install"
		sort -o "$out/$p.expected" "$out/$p.expected"
		if cmp -s "$out/$p.expected" "$out/$p.files"; then ok; else
			bad "$p's files are not $d's (debian/$d.install): $(diff "$out/$p.expected" "$out/$p.files" | grep '^[<>]' | head -5 | tr '\n' ' ')"
		fi
	done
	# make deb's packages, where they are and have this version.
	if ls "$debs"/libdat2-2-rs_"$version"_*.deb > /dev/null 2>&1; then
		for p in $pkgs; do
			d=$(deb_of "$p")
			deb=$(ls "$debs/${d}_${version}"_*.deb 2> /dev/null | head -1)
			if [ -z "$deb" ]; then
				bad "no $d in $debs"
				continue
			fi
			multiarch=$(dpkg-deb -f "$deb" Architecture | xargs dpkg-architecture -qDEB_HOST_MULTIARCH -a 2> /dev/null)
			dpkg-deb -c "$deb" | awk '$1 !~ /^d/ { print $6 }' | sed 's|^\.||' |
				sed "s|^/usr/lib/$multiarch/|$libdir/|" |
				grep -v '^/usr/share/doc/\|^/usr/share/lintian/' |
				grep -vx "$libdir/libdat2.so.2.0.0" | sort > "$out/$p.deb-files"
			if cmp -s "$out/$p.deb-files" "$out/$p.files"; then ok; else
				bad "$p's files are not those of $(basename "$deb"): $(diff "$out/$p.deb-files" "$out/$p.files" | grep '^[<>]' | head -5 | tr '\n' ' ')"
			fi
		done
	else
		echo "rpm-check: no Debian packages of $version in $debs: the files compared with debian/*.install only"
	fi

	# --------------------------------------------------- scriptlets
	arch=$(rpm -qp --qf '%{ARCH}' "${file_of[udapl-rs-libdat2]}" 2> /dev/null)
	reg=/usr/libexec/udapl-rs/datconf-register
	for p in $pkgs; do
		[ -n "${file_of[$p]:-}" ] || continue
		rpm -qp --scripts "${file_of[$p]}" > "$out/$p.scripts" 2> /dev/null
		echo "rpm-check: rpm -qp --scripts $p:"
		if [ -s "$out/$p.scripts" ]; then sed 's/^/    /' "$out/$p.scripts"; else echo "    (none)"; fi
	done
	for pk in udapl-rs:tcp:libdaplrs.so.2 udapl-rs-verbs:verbs:libdaplrs-verbs.so.2 udapl-rs-ofi:ofi:libdaplrs-ofi.so.2; do
		IFS=: read -r p kind lib <<< "$pk"
		s=$out/$p.scripts
		[ -f "$s" ] || continue
		# the scriptlets' bodies, each in a file of its own
		awk -v dir="$out/$p" '/^[a-z]+ (scriptlet|program)/ { f = dir "." $1 } f { print > f }' "$s"
		grep -qxF "$reg -p rpm -a $arch add $kind $libdir/$lib" "$out/$p.postinstall" 2> /dev/null && ok ||
			bad "$p's %post does not run $reg -p rpm -a $arch add $kind $libdir/$lib"
		grep -q '^/sbin/ldconfig$' "$out/$p.postinstall" 2> /dev/null && ok || bad "$p's %post does not run ldconfig"
		grep -q "^[[:space:]]*$reg -p rpm -a $arch remove $kind\$" "$out/$p.preuninstall" 2> /dev/null &&
			grep -q '"$1" -eq 0' "$out/$p.preuninstall" && ok ||
			bad "$p's %preun does not run $reg -p rpm -a $arch remove $kind on erase (\$1 = 0) only"
		grep -q 'postuninstall program: /sbin/ldconfig' "$s" && ok || bad "$p's %postun does not run ldconfig"
	done
	for p in udapl-rs-libdat2 udapl-rs-libdat1; do
		grep -q 'postinstall program: /sbin/ldconfig' "$out/$p.scripts" &&
			grep -q 'postuninstall program: /sbin/ldconfig' "$out/$p.scripts" && ok ||
			bad "$p's %post and %postun do not run ldconfig"
	done
	for p in udapl-rs-devel udapl-rs-utils; do
		[ ! -s "$out/$p.scripts" ] && ok || bad "$p has scriptlets"
	done

	# ------------------------------------------------------ the root
	if ! why=$(bookworm_root "$root" "$out" "$work/dl"); then
		bad "$why"
		summary
	fi
	RPM_CHECK_COUNTS="$passed $failed" unshare --mount --net --pid --fork --mount-proc \
		bash "$0" --inside "$work" "$rpms"
	rc=$?
	if [ $rc -ne 0 ] && [ $rc -ne 1 ]; then
		bad "the test's namespace ended with status $rc, before its summary"
		summary
	fi
	exit $rc
fi

# ------------------------------------------------------------- inside
# Private mount, network and pid namespaces (unshare above).
root=$work/root
out=$work/logs
read -r passed failed <<< "${RPM_CHECK_COUNTS:-0 0}"
conf=$root/etc/dat.conf

ip link set lo up
ip link add udrs0 type veth peer name udrs1 && ip addr add 198.51.100.1/24 dev udrs0 &&
	ip link set udrs0 up && ip link set udrs1 up || bad "no veth pair for rs-tcp-<interface>"
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys" 2> /dev/null || mount --bind -o ro /sys "$root/sys"
mkdir -p "$root/dev/shm"
mount -t tmpfs tmpfs "$root/dev/shm"
mount -t tmpfs tmpfs "$root/tmp"

in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
# rpm on the root: its database in the root's /var/lib/rpm (Debian's rpm
# defaults to ~/.rpmdb), the scriptlets chrooted into it.
rpmr() { rpm --root "$root" --dbpath /var/lib/rpm "$@"; }
names="udapl-rs-libdat2 udapl-rs-libdat1 udapl-rs udapl-rs-verbs udapl-rs-ofi udapl-rs-devel udapl-rs-utils"

# An RPM distribution's root, as far as ours can tell: no OFED registry
# (our udapl-rs-libdat2 conflicts with dapl), OFED's dat.conf kept as the
# site's file, /usr/lib64 on the loader's path, an rpm database.
cp "$conf" "$work/dat.conf.ofed" 2> /dev/null
[ -s "$work/dat.conf.ofed" ] && ok || bad "the root has no Debian /etc/dat.conf"
in_root dpkg --purge dapl2-utils libdapl2 > "$out/purge-ofed.log" 2>&1 && ok ||
	bad "purging libdapl2 in the root: $(tail -2 "$out/purge-ofed.log")"
cp "$work/dat.conf.ofed" "$conf"
cp "$conf" "$work/dat.conf.before"
echo /usr/lib64 > "$root/etc/ld.so.conf.d/00-lib64.conf"
in_root ldconfig
rpmr --initdb && ok || { bad "rpm --initdb in the root"; summary; }

# lib_cached SONAME: the root's loader cache has SONAME in /usr/lib64.
lib_cached() { in_root ldconfig -p | grep -q "^[[:space:]]*$1 .*=> /usr/lib64/$1\$"; }
entry() { # NAME LIBRARY PARAMS: all four entries present
	local api ts
	for api in 2.0 1.2; do for ts in nonthreadsafe threadsafe; do
		grep -qxF "$1 u$api $ts default $2 dapl.$api \"$3\" \"\"" "$conf" || return 1
	done; done
}
scriptlets_ok() { # LOG: rpm said no scriptlet failed
	! grep -qi 'scriptlet failed\|error' "$1"
}

# ------------------------------------------------------------ install
if rpmr -ivh --nodeps "$rpms"/*.rpm > "$out/install.log" 2>&1 && scriptlets_ok "$out/install.log"; then ok; else
	bad "rpm -i of our packages: $(grep -m3 -i 'error\|fail\|warn' "$out/install.log")"
	summary
fi
for p in $names; do
	rpmr -q "$p" > /dev/null 2>&1 && ok || bad "$p is not installed"
done
rpmr -V --nodeps $names > "$out/verify.log" 2>&1 && [ ! -s "$out/verify.log" ] && ok ||
	bad "rpm -V: $(head -3 "$out/verify.log")"
for s in datconf-register datconf-merge; do
	cmp -s "$top/scripts/$s" "$root/usr/libexec/udapl-rs/$s" && ok ||
		bad "the installed /usr/libexec/udapl-rs/$s is not scripts/$s"
done
for l in libdat2.so.2 libdat.so.1 libdaplrs.so.2 libdaplrs-verbs.so.2 libdaplrs-ofi.so.2; do
	lib_cached $l && ok || bad "$l is not in the root's loader cache (the scriptlets' ldconfig)"
done

# dat.conf: the old bytes first, unchanged, then our block
size=$(wc -c < "$work/dat.conf.before")
cmp -s -n "$size" "$work/dat.conf.before" "$conf" && ok || bad "dat.conf's existing bytes changed"
[ "$(grep -c '^# BEGIN udapl-rs providers (RPM packages)' "$conf")" = 1 ] && ok || bad "not one block of ours in dat.conf"
entry rs-tcp libdaplrs.so.2 "tcp lo" && ok || bad "no rs-tcp entries in dat.conf"
entry rs-tcp-udrs0 libdaplrs.so.2 "tcp udrs0" && ok || bad "no rs-tcp-udrs0 entries (an interface with an IPv4 address)"
entry rs-ofi-tcp libdaplrs-ofi.so.2 "ofi tcp lo" && ok || bad "no rs-ofi-tcp entries (datinfo --ofi-entries)"
entry rs-ofi-shm libdaplrs-ofi.so.2 "ofi shm shm" && ok || bad "no rs-ofi-shm entries (datinfo --ofi-entries)"
grep -q '^# udapl-rs: udapl-rs over TCP' "$conf" && ok || bad "the block's comments do not name the RPM packages"
[ "$(ls "$root/var/lib/udapl-rs/dat.conf.d" 2> /dev/null | tr '\n' ' ')" = "10-tcp.x86_64 20-verbs.x86_64 30-ofi.x86_64 " ] && ok ||
	bad "the providers' state files: $(ls "$root/var/lib/udapl-rs/dat.conf.d" 2>&1 | tr '\n' ' ')"
cp "$conf" "$out/dat.conf.installed"
echo "rpm-check: /etc/dat.conf in the root after rpm -i (our block):"
sed -n '/^# BEGIN udapl-rs providers (RPM packages)/,/^# END/p' "$conf" | grep -v ' threadsafe \| u1\.2 ' | sed 's/^/    /'

# a program's view: datinfo opens rs-tcp through /etc/dat.conf, its u2.0
# entries through our libdat2.so.2, its u1.2 ones through libdat.so.1
in_root timeout 60 datinfo rs-tcp > "$out/datinfo.log" 2>&1
grep -q 'IA address 127.0.0.1' "$out/datinfo.log" && ok || bad "datinfo did not open rs-tcp (see $out/datinfo.log)"
grep -q "DAT 1.2 entry, opened through .*libdat.so.1" "$out/datinfo.log" && ok ||
	bad "datinfo did not open rs-tcp's u1.2 entries through libdat.so.1 (see $out/datinfo.log)"

# --------------------------------------------- a user's line, an upgrade
printf 'user-ia u2.0 nonthreadsafe default libdaplrs.so.2 dapl.2.0 "tcp lo" ""\n' >> "$conf"
cp "$conf" "$out/dat.conf.user"
if rpmr -Uvh --replacepkgs --nodeps "$rpms"/*.rpm > "$out/upgrade.log" 2>&1 && scriptlets_ok "$out/upgrade.log"; then ok; else
	bad "rpm -U --replacepkgs (the upgrade's scriptlets): $(grep -m3 -i 'error\|fail\|warn' "$out/upgrade.log")"
fi
cmp -s "$out/dat.conf.user" "$conf" && ok || {
	bad "an upgrade changed dat.conf (a user's line, or our entries; diff below)"
	diff "$out/dat.conf.user" "$conf" | head -10
}
sed -i '/^user-ia /d' "$conf"

# erasing one provider takes exactly its entries
if rpmr -e udapl-rs-ofi > "$out/erase-ofi.log" 2>&1 && scriptlets_ok "$out/erase-ofi.log"; then ok; else
	bad "rpm -e udapl-rs-ofi: $(head -3 "$out/erase-ofi.log")"
fi
grep -v ' libdaplrs-ofi.so.2 \|^# udapl-rs-ofi:\|^# (datinfo --ofi-entries' "$out/dat.conf.installed" | cmp -s - "$conf" && ok ||
	bad "erasing udapl-rs-ofi changed more than its entries (diff in $out/erase-ofi.diff)"
diff "$out/dat.conf.installed" "$conf" > "$out/erase-ofi.diff"
entry rs-tcp libdaplrs.so.2 "tcp lo" && ok || bad "erasing udapl-rs-ofi took rs-tcp's entries"

# ---------------------------------------------------------------- erase
left=$(rpmr -qa --qf '%{NAME}\n' 2> /dev/null | sort | tr '\n' ' ')
# shellcheck disable=SC2086 # the package names, one argument each
if rpmr -e $left > "$out/erase.log" 2>&1 && scriptlets_ok "$out/erase.log"; then ok; else
	bad "rpm -e of ours: $(head -3 "$out/erase.log")"
fi
cmp -s "$work/dat.conf.before" "$conf" && ok || {
	bad "dat.conf is not byte for byte as before (diff below)"
	diff "$work/dat.conf.before" "$conf" | head -20
}
[ -z "$(rpmr -qa 2> /dev/null)" ] && ok || bad "left installed: $(rpmr -qa | tr '\n' ' ')"
[ ! -e "$root/var/lib/udapl-rs" ] && [ ! -e "$root/usr/libexec/udapl-rs" ] && [ ! -e "$root/usr/lib64/libdat2.so.2" ] && ok ||
	bad "left after rpm -e: $(ls -d "$root/var/lib/udapl-rs" "$root/usr/libexec/udapl-rs" "$root/usr/lib64/libdat2.so.2" 2> /dev/null)"
lib_cached libdat2.so.2 && bad "libdat2.so.2 still in the loader's cache after rpm -e (the %postun's ldconfig)" || ok

# --------------------------------------------------- without dat.conf
rm -f "$conf"
if rpmr -ivh --nodeps "$rpms"/*.rpm > "$out/install-alone.log" 2>&1 && scriptlets_ok "$out/install-alone.log"; then ok; else
	bad "rpm -i with no dat.conf: $(grep -m3 -i 'error\|fail\|warn' "$out/install-alone.log")"
fi
head -1 "$conf" 2> /dev/null | grep -qxF '# BEGIN udapl-rs providers (RPM packages) [created]' && ok ||
	bad "with no dat.conf before, it does not start with our block ($(head -1 "$conf" 2>&1))"
entry rs-tcp libdaplrs.so.2 "tcp lo" && ok || bad "with no dat.conf before: no rs-tcp entries"
# shellcheck disable=SC2086
rpmr -e $names > "$out/erase-alone.log" 2>&1 && scriptlets_ok "$out/erase-alone.log" && ok ||
	bad "rpm -e with no dat.conf before: $(head -3 "$out/erase-alone.log")"
[ ! -e "$conf" ] && ok || bad "erasing ours left an /etc/dat.conf they had created"

# ------------------------------------------------- OFED's dapl packages
# Empty stand-ins for RHEL's dapl, dapl-devel and dapl-utils, in the
# root's database only (rpm --justdb): rpm refuses ours for the three
# conflicts, and the providers' "udapl-rs-libdat2 or dapl" is met by
# dapl (without it, and without our registry, rpm says it is missing).
main_rpms=$(ls "$rpms"/udapl-rs-[0-9]*.rpm "$rpms"/udapl-rs-utils-[0-9]*.rpm)
# shellcheck disable=SC2086 # two files
rpmr -i --test $main_rpms > "$out/no-registry.log" 2>&1
grep -q '(udapl-rs-libdat2.* or dapl.*) is needed by udapl-rs-' "$out/no-registry.log" && ok ||
	bad "udapl-rs without a registry: rpm does not miss (udapl-rs-libdat2 or dapl) (see $out/no-registry.log)"
mkdir -p "$work/ofed/SPECS"
cat > "$work/ofed/SPECS/dapl.spec" << 'EOF'
Name: dapl
Version: 2.1.10
Release: 1
Summary: stand-in for OFED's dapl (rpm-check.sh)
License: BSD
%description
stand-in
%package devel
Summary: stand-in
%description devel
stand-in
%package utils
Summary: stand-in
%description utils
stand-in
%files
%files devel
%files utils
EOF
if rpmbuild -bb --quiet --define "_topdir $work/ofed" --define 'debug_package %{nil}' \
	"$work/ofed/SPECS/dapl.spec" > "$out/dapl-standin.log" 2>&1 &&
	rpmr -i --justdb --nodeps "$work"/ofed/RPMS/*/dapl*.rpm >> "$out/dapl-standin.log" 2>&1; then
	rpmr -i --test "$rpms"/*.rpm > "$out/conflicts.log" 2>&1
	for pc in udapl-rs-libdat2:dapl udapl-rs-devel:dapl-devel udapl-rs-utils:dapl-utils; do
		p=${pc%%:*} c=${pc#*:}
		grep -q "^[[:space:]]*$c conflicts with $p-\|^[[:space:]]*$p conflicts with $c-" "$out/conflicts.log" && ok ||
			bad "rpm -i beside $c does not refuse $p for the conflict (see $out/conflicts.log)"
	done
	# shellcheck disable=SC2086
	rpmr -i --test $main_rpms > "$out/beside-dapl.log" 2>&1
	grep -q '(udapl-rs-libdat2.* or dapl.*) is needed' "$out/beside-dapl.log" &&
		bad "beside dapl, udapl-rs still misses (udapl-rs-libdat2 or dapl) (see $out/beside-dapl.log)" || ok
else
	bad "the dapl stand-ins: $(tail -3 "$out/dapl-standin.log")"
fi
summary
