#!/usr/bin/env bash
# `make install PREFIX=...` then `make uninstall`, as a packager would: a
# consumer builds with pkg-config against the installed tree and runs with
# the installed library; uninstall leaves nothing behind.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
prefix=$(mktemp -d /tmp/udapl-rs-install.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "install-check: $*"; }

make -s -C "$top" install PREFIX="$prefix" >/dev/null || bad "make install failed"
for f in lib/libdat2.so.2 lib/libdat2.so include/dat2/udat.h include/dat2/dat_types.h \
	lib/pkgconfig/dat2.pc etc/dat.conf.udapl-rs.example; do
	[ -e "$prefix/$f" ] && ok || bad "missing $f"
done
[ "$(readlink "$prefix/lib/libdat2.so")" = libdat2.so.2 ] && ok || bad "libdat2.so is not a link to libdat2.so.2"

cat > "$prefix/consumer.c" <<'C'
#include <dat2/udat.h>
#include <string.h>
int main(void)
{
	DAT_IA_HANDLE ia;
	DAT_EVD_HANDLE evd = DAT_HANDLE_NULL;
	DAT_RETURN rc = dat_ia_open("no-such-ia", 8, &evd, &ia);
	const char *major, *minor;
	dat_strerror(rc, &major, &minor);
	return !(DAT_GET_TYPE(rc) == DAT_PROVIDER_NOT_FOUND && strcmp(major, "DAT_PROVIDER_NOT_FOUND") == 0);
}
C
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
if cc "$prefix/consumer.c" -o "$prefix/consumer" $(pkg-config --cflags --libs dat2) -Wl,-rpath,"$prefix/lib"; then
	ok
	# as installed: no LD_LIBRARY_PATH pointing into the build tree
	if env -u LD_LIBRARY_PATH DAT_OVERRIDE=/dev/null "$prefix/consumer"; then ok; else bad "installed consumer failed"; fi
	env -u LD_LIBRARY_PATH ldd "$prefix/consumer" | grep -q "$prefix/lib/libdat2.so.2" && ok || bad "consumer did not link the installed libdat2"
else
	bad "consumer does not build with pkg-config"
fi

make -s -C "$top" uninstall PREFIX="$prefix" >/dev/null || bad "make uninstall failed"
left=$(cd "$prefix" && find . -type f ! -name 'consumer*' | sort)
[ -z "$left" ] && ok || bad "left after uninstall: $left"
echo "install-check: $passed passed, $failed failed"
