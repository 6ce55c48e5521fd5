#!/usr/bin/env bash
# Debian's uDAPL test programs built from their SOURCES against our headers:
# dtest, dtestx, dtestcm, dtestsrq and dapltest of Debian's `dapl` source
# package (bookworm; `make -C tests-c debian-src` fetches it into
# build/debian-src), compiled unchanged against include/ with the system's
# DAT headers out of sight, linked against build/lib/libdat2.so.2, then run
# against our provider rs-tcp on 127.0.0.1.
#
# Out of sight: the compiles run in a private mount namespace (unshare -m,
# as root) in which an empty directory is mounted over every dat2/ (and
# dat/) directory of the compiler's system include path, so an #include
# that our include/ does not satisfy fails the compile; a canary compile
# proves the hiding works. Per program: it builds, it compiles with exactly
# the warnings it has against Debian's headers (same source, same flags),
# and its libdat2.so.2 resolves to ours.
#
# Runs: dapltest -T S server with a -T T transaction client (validated) and
# its -T Q, one FFT suite (queryinfo), and the dtest family's pairs: dtest,
# dtestcm, dtestx, dtestx -p, dtestsrq, and dtestx -q (conformance-lib.sh).
#
# Prints "debian-sources: N passed, N failed".
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
src=${DAPL_SRC:-$top/build/debian-src/dapl-2.1.10.1.f1e05b7a}
out="$top/build/tests/debian-sources"
bin="$out/bin"
ia=rs-tcp addr=127.0.0.1
conf_name=debian-sources
. "$top/tests-c/scripts/conformance-lib.sh"

summary() {
	echo "debian-sources: $passed passed, $failed failed"
	[ $failed -eq 0 ]
	exit
}

rm -rf "$out"
mkdir -p "$bin" "$out/empty"
if [ ! -f "$src/test/dtest/dtest.c" ] || [ ! -f "$src/test/dapltest/Makefile.am" ]; then
	bad "no Debian dapl source at $src (make -C tests-c debian-src fetches it)"
	summary
fi

# ------------------------------------------------------------------ build
# Flags as Debian's Makefile.am give them (dtestx and dapltest are built
# with the IB extensions there: -DDAT_EXTENSIONS).
cflags="-g -Wall -D_GNU_SOURCE"
link="-L$top/build/lib -Wl,-rpath,$top/build/lib -ldat2 -lpthread"
dt="$src/test/dtest"
dapltest_dir="$src/test/dapltest"
dapltest_srcs=$(sed -n '/^dapltest_SOURCES/,/^[[:space:]]*$/p' "$dapltest_dir/Makefile.am" |
	grep -o '[A-Za-z0-9_/]*\.c' | tr '\n' ' ')
programs="dtest dtestx dtestcm dtestsrq dapltest"

# compile_cmd PROG HEADERS: the compile of PROG, against our include/ (ours)
# or the system's (debian, syntax only: the warnings baseline).
compile_cmd() {
	local prog=$1 which=$2 inc="" x="" what
	[ "$which" = ours ] && inc="-I$top/include"
	case $prog in dtestx | dapltest) x="-DDAT_EXTENSIONS" ;; esac
	if [ "$which" = ours ]; then what="-o $bin/$prog $link"; else what="-fsyntax-only"; fi
	if [ "$prog" = dapltest ]; then
		echo "cd '$dapltest_dir' && cc $cflags $x -I include -I mdep/linux $inc $dapltest_srcs $what"
	else
		echo "cc $cflags $x $inc '$dt/$prog.c' $what"
	fi
}

# The build script run inside the namespace: the canary first, then each
# program, its log and exit status in $out/build-<prog>.{log,rc}.
{
	echo "printf '#include <dat2/udat.h>\\n' | cc -E -x c - -o /dev/null > '$out/build-canary.log' 2>&1"
	echo "echo \$? > '$out/build-canary.rc'"
	for p in $programs; do
		echo "( $(compile_cmd $p ours) ) > '$out/build-$p.log' 2>&1"
		echo "echo \$? > '$out/build-$p.rc'"
	done
} > "$out/build.sh"

# Every dat2/ (and DAT 1.2's dat/) under the compiler's system include path.
hide=""
for d in $(cc -E -x c -v /dev/null -o /dev/null 2>&1 | sed -n '/^#include <...> search starts here:/,/^End of search list./p' | grep '^ /'); do
	for sub in dat2 dat; do
		[ -d "$d/$sub" ] && hide="$hide $d/$sub"
	done
done
mounts=""
for d in $hide; do mounts="$mounts mount --bind '$out/empty' '$d' &&"; done
if ! unshare -m sh -c "$mounts sh '$out/build.sh'" > "$out/unshare.log" 2>&1; then
	bad "cannot build in a private mount namespace (unshare -m needs root): $(head -1 "$out/unshare.log")"
	summary
fi
if [ "$(cat "$out/build-canary.rc" 2>/dev/null)" = 1 ] && grep -q 'dat2/udat.h: No such file' "$out/build-canary.log"; then
	ok
else
	bad "the system's <dat2/udat.h> was still visible in the namespace (hidden:${hide:- nothing})"
	summary
fi

# warnings FILE: the compiler's warnings, without line and column numbers
# and directory prefixes, sorted.
warnings() {
	grep -E 'warning:' "$1" | grep -v '/usr/bin/ld' |
		sed -E 's|^([^:]*/)?([^/:]+):[0-9]+:[0-9]+:|\2:|' | sort
}

for p in $programs; do
	if [ "$(cat "$out/build-$p.rc")" = 0 ] && [ -x "$bin/$p" ]; then
		ok
	else
		rm -f "$bin/$p"
		bad "$p does not build against our headers: $(grep -m1 -E 'error|undefined' "$out/build-$p.log") (see $out/build-$p.log)"
		continue
	fi
	# the same source against Debian's headers: same warnings
	if [ -f /usr/include/dat2/udat.h ]; then
		(eval "$(compile_cmd $p debian)") > "$out/baseline-$p.log" 2>&1
		if diff <(warnings "$out/baseline-$p.log") <(warnings "$out/build-$p.log") > "$out/warnings-$p.diff"; then
			ok
		else
			bad "$p: its warnings against our headers differ from those against Debian's: $(grep -m1 '^[<>]' "$out/warnings-$p.diff") (see $out/warnings-$p.diff)"
		fi
	else
		bad "$p: no /usr/include/dat2/udat.h (libdapl-dev) to compare warnings with"
	fi
	# linked against our libdat2
	lib=$(ldd "$bin/$p" | awk '$1 == "libdat2.so.2" {print $3}')
	if [ "$lib" = "$top/build/lib/libdat2.so.2" ]; then ok; else bad "$p: libdat2.so.2 resolves to '$lib', not ours"; fi
done

# DEBIAN_SOURCES_BUILD_ONLY set: the programs for another script (ofi-dapltest.sh), no runs.
[ -n "${DEBIAN_SOURCES_BUILD_ONLY:-}" ] && summary

# -------------------------------------------------------------------- run
src_env() { env LD_LIBRARY_PATH="$top/build/lib" DAT_OVERRIDE="$top/dat.conf" "$@"; }
if [ -x "$bin/dapltest" ]; then
	dapltest_bin="$bin/dapltest"
	if start_server "$out/src_env-dapltest-server.log" "Service Point Ready" src_env timeout 120 "$bin/dapltest" -T S -D $ia; then
		client src_env T-SR-validate "$bin/dapltest" -T T -s $addr -D $ia -i 100 -t 1 -w 1 -V -P \
			client SR 1024 -f server SR 1536 2 -f
		client src_env T-RW-RR "$bin/dapltest" -T T -s $addr -D $ia -i 256 -t 1 -w 1 \
			client RW 4096 1 server RR 1024 1 client SR 256 1 server SR 256 1
		client src_env Q "$bin/dapltest" -T Q -s $addr -D $ia
		if finish_server 20; then ok; else bad "dapltest server exit status (see $out/src_env-dapltest-server.log)"; fi
	fi
	fft src_env queryinfo
fi

# The dtest family's pairs, from our build.
dtest_family src_env "$bin"
summary
