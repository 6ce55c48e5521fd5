#!/usr/bin/env bash
# datinfo as a new user meets it: the repo's dat.conf shows rs-tcp with its
# IA address; entries that cannot work say exactly why.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
conf=$(mktemp /tmp/datinfo-check.XXXXXX)
trap 'rm -f "$conf"' EXIT
passed=0 failed=0
expect() { if grep -qF -- "$2" <<<"$1"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "datinfo-check: missing '$2' in:"; echo "$1"; fi; }

out=$(DAT_OVERRIDE="$top/dat.conf" "$top/build/bin/datinfo" 2>&1)
expect "$out" "rs-tcp  u2.0 nonthreadsafe default  libdaplrs.so.2  \"tcp lo\""
expect "$out" "IA address 127.0.0.1"

cat > "$conf" <<CONF
rs-missing u2.0 nonthreadsafe default libdaplrs-missing.so.2 dapl.2.0 "tcp lo" ""
rs-nosuchif u2.0 nonthreadsafe default libdaplrs.so.2 dapl.2.0 "tcp nosuchif0" ""
CONF
out=$(DAT_OVERRIDE="$conf" "$top/build/bin/datinfo" 2>&1); rc=$?
expect "$out" "cannot load: provider library 'libdaplrs-missing.so.2': libdaplrs-missing.so.2: cannot open shared object file"
expect "$out" "rs-nosuchif"
expect "$out" "interface nosuchif0 does not exist or has no IPv4 address"
[ $rc -ne 0 ] && passed=$((passed + 1)) || { failed=$((failed + 1)); echo "datinfo-check: exit status 0 despite failing entries"; }
echo "datinfo-check: $passed passed, $failed failed"
