#!/usr/bin/env bash
# A DAT 1.2 process and a DAT 2.0 process talk over $DAT_TEST_IA (default
# rs-tcp): build/tests/test_interop12 (<dat/udat.h>, libdat.so.1) and
# build/tests/test_interop20 (<dat2/udat.h>, libdat2.so.2), both built from
# tests-c/programs/test_interop12.c, exchange sends and RDMA reads and check each
# other's data; once with the 1.2 process as the server, once with the 2.0
# one. The client starts only once the server has printed that it listens
# (read from a FIFO under a timeout, no fixed sleep); every process runs
# under a timeout. Needs LD_LIBRARY_PATH and DAT_OVERRIDE as `make test`
# sets them (a dat.conf with the IA's u1.2 and u2.0 entries).
# Ends with "interop12: N passed, N failed" (the programs' checks plus one
# for each process's exit status).
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
bin=$top/build/tests
work=$(mktemp -d /tmp/udapl-rs-interop12.XXXXXX)
server_pid=
cleanup() {
	[ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "interop12: FAIL: $*"; }
# Adds a program's "N passed, N failed" line to the totals.
add_counts() {
	local line p f
	line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$1" | tail -1)
	if [ -z "$line" ]; then
		bad "no summary in $(basename "$1")"
		return
	fi
	p=$(sed -E 's/.* ([0-9]+) passed, ([0-9]+) failed.*/\1/' <<<"$line")
	f=$(sed -E 's/.* ([0-9]+) passed, ([0-9]+) failed.*/\2/' <<<"$line")
	passed=$((passed + p)) failed=$((failed + f))
}

for t in test_interop12 test_interop20; do
	if [ ! -x "$bin/$t" ]; then
		echo "interop12: FAIL: $bin/$t is missing (run make -C tests-c all first)"
		echo "interop12: 0 passed, 1 failed"
		exit 1
	fi
done

# pair SERVER_VERSION CLIENT_VERSION (12 or 20)
pair() {
	local sv=$1 cv=$2 line port= src crc
	local fifo=$work/server-$sv.fifo slog=$work/server-$sv.log clog=$work/client-$cv.log
	local sver=${sv:0:1}.${sv:1} cver=${cv:0:1}.${cv:1}
	local name="DAT $sver server, DAT $cver client"
	mkfifo "$fifo"
	timeout -k 5 60 "$bin/test_interop$sv" server "$cver" > "$fifo" 2>&1 &
	server_pid=$!
	exec 3< "$fifo"
	: > "$slog"
	# the server's first lines, up to the one that says it listens
	while IFS= read -r -t 30 -u 3 line; do
		printf '%s\n' "$line" >> "$slog"
		if [[ $line =~ ^interop12:\ listening\ on\ port\ ([0-9]+)$ ]]; then
			port=${BASH_REMATCH[1]}
			break
		fi
	done
	if [ -z "$port" ]; then
		bad "$name: the DAT $sver server did not say it listens within 30 s"
		sed 's/^/    /' "$slog"
		kill "$server_pid" 2>/dev/null
		wait "$server_pid" 2>/dev/null
		server_pid=
		exec 3<&-
		return
	fi
	cat <&3 >> "$slog" &
	local drain=$!
	timeout -k 5 60 "$bin/test_interop$cv" client "$sver" "$port" > "$clog" 2>&1
	crc=$?
	wait "$server_pid"
	src=$?
	server_pid=
	wait "$drain"
	exec 3<&-
	echo "  DAT $sver server: $(grep -E 'passed, [0-9]+ failed' "$slog" | tail -1)"
	echo "  DAT $cver client: $(grep -E 'passed, [0-9]+ failed' "$clog" | tail -1)"
	grep '^FAIL' "$slog" "$clog" | sed 's/^/    /'
	add_counts "$slog"
	add_counts "$clog"
	[ $src -eq 0 ] && ok || bad "$name: DAT $sver server exit status $src"
	[ $crc -eq 0 ] && ok || bad "$name: DAT $cver client exit status $crc"
}

pair 12 20
pair 20 12
echo "interop12: $passed passed, $failed failed"
[ $failed -eq 0 ]
