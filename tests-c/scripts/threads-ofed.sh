#!/usr/bin/env bash
# test_threads through OFED's libdat2 (Debian's libdat2.so.2, from the
# system) instead of ours: the threadsafe entry is found there too, each IA
# reports its own entry's thread safety (OFED's dat_ia_close finds the
# registry entry to close by it, so a wrong answer closes the other entry),
# and a short run of the threaded traffic passes.
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
bin=$top/build/tests/test_threads_ofed
conf=$(mktemp /tmp/threads-ofed.XXXXXX)
trap 'rm -f "$conf"' EXIT
sed -n "s|default libdaplrs.so.2 |default $top/build/lib/libdaplrs.so.2 |p" "$top/build/tests/dat.conf" | grep '^rs-tcp ' > "$conf"
lib=$(env -u LD_LIBRARY_PATH ldd "$bin" | awk '/libdat2/ {print $3}')
case "$lib" in
	*/build/lib/*|"") echo "threads-ofed: $bin does not load the system's libdat2 ($lib)"; echo "threads-ofed: 0 passed, 1 failed"; exit 1 ;;
esac
env -u LD_LIBRARY_PATH DAT_OVERRIDE="$conf" "$bin" 200 1 2 2 2
