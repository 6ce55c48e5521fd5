# Helpers of the conformance scripts (conformance-dapltest.sh,
# debian-sources.sh), sourced by them. The caller sets $out (the log
# directory), $ia and $addr (the IA name and its address) and, for the
# FAIL lines, $conf_name.
#
# Every server runs under `timeout`, is waited for by its readiness (a line
# in its log, a listening port), never by a fixed sleep, and is killed if it
# outlives its client by more than a grace period.

passed=0 failed=0
ok() { passed=$((passed + 1)); }
# With $deferred set (to a newline), FAIL lines are collected there instead
# of printed, for a caller that may retry (dtestx_pair).
deferred=""
bad() {
	failed=$((failed + 1))
	if [ -n "$deferred" ]; then
		deferred="$deferred${conf_name:-conformance}: FAIL: $*"$'\n'
	else
		echo "${conf_name:-conformance}: FAIL: $*"
	fi
}

# start_server LOG READY CMD...: starts CMD in the background (its pid in
# $server_pid), waits up to 10 s for READY (a grep pattern) in its log. An
# empty READY does not wait (for servers whose output is not flushed: the
# caller waits for their port instead).
start_server() {
	local log=$1 ready=$2; shift 2
	"$@" > "$log" 2>&1 &
	server_pid=$!
	[ -z "$ready" ] && return 0
	for _ in $(seq 100); do
		grep -qs "$ready" "$log" && return 0
		kill -0 $server_pid 2>/dev/null || break
		sleep 0.1
	done
	bad "server did not become ready: $* (see $log)"
	stop_server
	return 1
}

# stop_server: ends the server started last. CMD runs in a subshell when it
# starts with a shell function (ours_env ...), so the subshell's children
# (the server's `timeout`, which passes the signal on) are ended first, by
# their process ids.
stop_server() {
	local pid
	for pid in $(ps -o pid= --ppid $server_pid 2>/dev/null); do
		kill $pid 2>/dev/null
	done
	kill $server_pid 2>/dev/null
	wait $server_pid 2>/dev/null
}

# wait_port PORT: waits up to 10 s for the server to listen on TCP PORT.
wait_port() {
	for _ in $(seq 100); do
		ss -ltnH "sport = :$1" 2>/dev/null | grep -q . && return 0
		kill -0 $server_pid 2>/dev/null || break
		sleep 0.1
	done
	return 1
}

# finish_server GRACE: the server's exit status, once it exits; a server
# still running GRACE seconds after its client finished is killed (124).
finish_server() {
	local grace=$1
	for _ in $(seq $((grace * 10))); do
		kill -0 $server_pid 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 $server_pid 2>/dev/null; then
		stop_server
		return 124
	fi
	wait $server_pid
}

# client ENVF NAME CMD...: runs CMD under ENVF with a timeout; passes if it
# exits 0 (log in $out/ENVF-NAME.log).
client() {
	local envf=$1 name=$2; shift 2
	local log="$out/$envf-$name.log"
	if $envf timeout 120 "$@" > "$log" 2>&1; then ok; else bad "$envf $name: exit $? (see $log)"; fi
}

# dtest_pair ENVF NAME READY PORT FAIL MUST PROG [ARGS...]: the dtest family's
# pair, `PROG -P $ia -s ARGS` as the server (ready when its log matches
# READY and, unless PORT is -, when it listens on TCP PORT) and
# `PROG -P $ia -h $addr ARGS` as the client. Each side passes if it exits 0,
# prints no line matching FAIL (grep -E) and, unless MUST is empty, a line
# matching MUST. A failure quotes the first offending line. Each side runs
# under `timeout ${pair_timeout:-60}` (they take seconds), which keeps a
# hung pair from holding the whole script.
dtest_pair() {
	local envf=$1 name=$2 ready=$3 port=$4 fail=$5 must=$6; shift 6
	local slog="$out/$envf-$name-server.log" clog="$out/$envf-$name-client.log"
	local crc src side log rc why
	start_server "$slog" "$ready" $envf timeout ${pair_timeout:-60} "$@" -P $ia -s || return 0
	if [ "$port" != - ] && ! wait_port "$port"; then
		bad "$envf $name: server not listening on port $port (see $slog)"
		finish_server 0
		return 0
	fi
	$envf ${client_nice:+nice -n $client_nice} timeout ${pair_timeout:-60} "$@" -P $ia -h $addr > "$clog" 2>&1
	crc=$?
	finish_server ${pair_grace:-20}
	src=$?
	for side in client server; do
		if [ $side = client ]; then log=$clog rc=$crc; else log=$slog rc=$src; fi
		why=""
		if grep -Eq "$fail" "$log"; then
			why="printed '$(grep -Em1 "$fail" "$log" | sed 's/^[[:space:]]*//')'"
		elif [ -n "$must" ] && ! grep -Eq "$must" "$log"; then
			why="never printed /$must/; last line '$(grep -v '^[[:space:]]*$' "$log" | tail -1)'"
		elif [ $rc -ne 0 ]; then
			why="exit status $rc; last line '$(grep -v '^[[:space:]]*$' "$log" | tail -1)'"
		fi
		if [ -n "$why" ] && grep -q CONN_QUAL_IN_USE "$log"; then
			# Debian's programs listen on fixed ports inside the ephemeral
			# range (dtest: 45248); name whoever holds one (seen once, cause
			# not found: nothing of the run's own held it afterwards).
			ss -tanp > "$log.sockets" 2>&1
			why="$why; sockets at that moment in $log.sockets"
		fi
		if [ -z "$why" ]; then ok; else bad "$envf $name $side: $why (see $log)"; fi
	done
}

# fft ENV SUITE [LAST_CASE]: every case PASS (queryinfo case 5 is UNSUPP in
# dapltest itself: "tested in the conmgt test"), no assertion failed.
# LAST_CASE limits the check to cases 0..LAST_CASE. Runs $dapltest_bin
# (default: the PATH's dapltest).
fft() {
	local envf=$1 suite=$2 last=${3:-999} log="$out/fft-$1-$2.log"
	$envf timeout 120 ${dapltest_bin:-dapltest} -T F -D $ia -f "$suite" > "$log" 2>&1
	local rc=$?
	local results
	results=$(awk '/case: *[0-9]+/ {c=$NF} /^Result:/ {print c, $2}' "$log")
	local n=0 case result
	while read -r case result; do
		[ -z "$case" ] && continue
		[ "$case" -gt "$last" ] && continue
		n=$((n + 1))
		if [ "$result" = PASS ] || { [ "$suite" = queryinfo ] && [ "$case" = 5 ] && [ "$result" = UNSUPP ]; }; then
			ok
		else
			bad "$envf FFT $suite case $case: $result (see $log)"
		fi
	done <<<"$results"
	[ $n -gt 0 ] || bad "$envf FFT $suite ran no case (see $log)"
	if [ "$last" = 999 ]; then
		[ $rc -eq 0 ] && ok || bad "$envf FFT $suite exit status $rc (see $log)"
		if grep -q 'failed in file' "$log"; then
			bad "$envf FFT $suite: $(grep -m1 'failed in file' "$log")"
		else
			ok
		fi
	fi
}

# dtestx_pair ENVF NAME PROG [ARGS...]: dtest_pair for dtestx, whose server
# sends its address to the client first and creates its service point after:
# a client that connects in between is rejected by dtestx's own design:
# NON_PEER_REJECTED ("!conn established: 0x4003") for a connection, and for
# -u a failed datagram resolution, DAT_IB_UD_CONNECTION_ERROR_EVENT
# ("!conn established: 0x40004"; nobody listens at that service point, as
# IB's SIDR answers). With -u the client may instead wait for the server's
# own resolution while the server waits for the client's, until both time
# out, printing nothing (dtestx does not flush): our provider's log
# (DAT_LOG for its datagram engines, rs-tcp's and the ofi backend's,
# unbuffered) then names the refused resolution.
# That outcome, and only that, is retried, at most seven times, saying so (the
# window is the server's time from sending its address to dat_psp_create
# returning: it widens on a loaded machine, and over libfabric's tcp, whose
# passive endpoint takes an fi_getinfo, a load of 4 lost it three times running;
# a CI run lost it five times running). A retry runs the client at nice 19, so
# that on a busy machine the server, which runs as before, creates its service
# point first.
dtestx_pair() {
	local envf=$1 name=$2 p=$passed f=$failed try msgs client_nice=""; shift 2
	for try in 1 2 3 4 5 6 7 8; do
		deferred=$'\n'
		[ $try -eq 1 ] || client_nice=19
		dtest_pair $envf $name "" 15828 'FAILED|ERROR' "" env DAT_LOG=daplrs_tcp::engine::datagram=info,daplrs_libfabric::rdm::ud=info "$@"
		msgs=$deferred
		deferred=""
		if [ $try -lt 8 ] && [ $failed -gt $f ] &&
			grep -Eq '!conn established: 0x(4003|40004)$|datagram address resolution [0-9]+: Connection refused' \
				"$out/$envf-$name-client.log"; then
			echo "${conf_name:-conformance}: $envf $name: the client connected before the server's PSP existed (dtestx's race); once more"
			passed=$p failed=$f
			continue
		fi
		printf '%s' "${msgs#$'\n'}"
		break
	done
}

# dtest_family ENVF DIR: dtest, dtestcm, dtestx, dtestx -p, dtestx -u (not run,
# saying why, where $no_datagrams gives a reason), dtestx -q (the
# open-query extension, one process) and dtestsrq from
# DIR (empty: the PATH's, Debian's /usr/bin; a program missing from DIR is
# skipped, its build failure counted by the caller), server -s and client
# -h, each side passing on exit 0 and no FAILED or ERROR line (dtestsrq
# exits 0 after its errors too, so it must also say "Test Complete").
# dtest, dtestcm and dtestx clients read the server's address from its TCP
# port 15828, so the server is ready when that port listens (dtestx does not
# flush its output: the port is its only readiness).
dtest_family() {
	local envf=$1 dir=${2:+$2/} p
	for p in dtest dtestcm dtestx dtestsrq; do
		[ -z "$dir" ] || [ -x "$dir$p" ] || continue
		case $p in
		dtest) dtest_pair $envf dtest "waiting for client connection" 15828 'FAILED|ERROR' "" ${dir}dtest ;;
		dtestcm) if [ -n "${no_dtestcm:-}" ]; then
				echo "${conf_name:-conformance}: $envf dtestcm not run: $no_dtestcm"
				continue
			fi
			# $dtestcm_env: variables for dtestcm alone (NAME=VALUE ...);
			# $dtestcm_timeout: its pair's timeout where not pair_timeout's;
			# $dtestcm_grace: how long its server may outlive its client
			pair_grace=${dtestcm_grace:-${pair_grace:-20}} \
				pair_timeout=${dtestcm_timeout:-${pair_timeout:-60}} dtest_pair $envf dtestcm "waiting for client" 15828 'FAILED|ERROR' "" \
				${dtestcm_env:+env $dtestcm_env} ${dir}dtestcm ;;
		dtestx)
			dtestx_pair $envf dtestx ${dir}dtestx
			dtestx_pair $envf dtestx-p ${dir}dtestx -p
			# -u: unreliable datagrams (a client needs -c with -u; the server's
			# trailing -s overrides it)
			if [ -n "${no_datagrams:-}" ]; then
				echo "${conf_name:-conformance}: $envf dtestx -u not run: $no_datagrams"
			else
				dtestx_pair $envf dtestx-u ${dir}dtestx -c -u
			fi
			# -q: the attributes through dat_ib_open_query/dat_ib_close_query
			client $envf dtestx-q ${dir}dtestx -P $ia -q
			if grep -q "Open_Query: $ia num_attrs" "$out/$envf-dtestx-q.log"; then ok; else
				bad "$envf dtestx -q printed no Open_Query line (see $out/$envf-dtestx-q.log)"
			fi
			;;
		dtestsrq) if [ -n "${no_srq:-}" ]; then
				echo "${conf_name:-conformance}: $envf dtestsrq not run: $no_srq"
				continue
			fi
			dtest_pair $envf dtestsrq "ready on port" - 'FAILED|ERROR|Error|ERR[: ]' "Test Complete" ${dir}dtestsrq ;;
		esac
	done
}

# dapltest_transactions ENVF DIR: the dapltest server and every client line of
# the conformance set, then the dtest family's pairs (dtest_family ENVF DIR),
# all through the libdat2 that ENVF selects; the programs from DIR (empty:
# the PATH's).
dapltest_transactions() {
	local envf=$1 dir=${2:+$2/} dt
	dt=${dir}dapltest
	if start_server "$out/$envf-dapltest-server.log" "Service Point Ready" $envf timeout 300 $dt -T S -D $ia; then
		client $envf T-SR $dt -T T -s $addr -D $ia -i 100 -t 1 -w 1 client SR 256 1 server SR 256 1
		client $envf T-SR-validate $dt -T T -s $addr -D $ia -i 100 -t 1 -w 1 -V -P client SR 1024 -f server SR 1536 2 -f
		client $envf T-RW-RR $dt -T T -P -t 1 -w 1 -i 4096 -s $addr -D $ia client RW 4096 1 server RW 2048 4 \
			server RR 1024 1 client RR 2048 1 client SR 1024 3 -f server SR 256 3 -f
		client $envf T-4x4 $dt -T T -s $addr -D $ia -i 4096 -t 4 -w 4 client SR 8192 3 server SR 8192 3
		client $envf T-4x4-validate $dt -T T -s $addr -D $ia -i 256 -t 4 -w 4 -V client SR 8192 3 server SR 8192 3
		client $envf P-RW $dt -T P -s $addr -D $ia -i 2048 -m b RW 4096 2
		client $envf P-RR $dt -T P -s $addr -D $ia -i 4096 RR 32768 1
		client $envf Q $dt -T Q -s $addr -D $ia
		if finish_server 20; then ok; else bad "$envf dapltest server exit status (see $out/$envf-dapltest-server.log)"; fi
	fi

	dtest_family $envf "$2"
}
