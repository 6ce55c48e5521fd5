# Shell helpers of the soft-RoCE guest's benchmarks (run-bench-guest.sh,
# dto-cost.sh), sourced by both on the host and in the guest. The functions
# that run pairs work in the directory that holds logs/ and failures.txt and
# use STEP_TIMEOUT (seconds per client), t0 (the start, in $SECONDS) and
# server_pid (the server to stop on exit).

# The guest scripts/rxe-vm boots: rxe0 on netdev rxenet0 = 192.0.2.1/24,
# port 1, GID index 1; our entry over it and OFED's.
ADDR=192.0.2.1
OURS=rs-rxe0
OFED=ofa-v2-rxe
DEV=rxe0
GID_INDEX=1

# Debian packages the guest's measurements run (the guest sees this
# machine's root): perftest, OFED's provider, the rxe user-space driver,
# librdmacm, dapl2-utils (dtestcm), valgrind and strace (dto-cost.sh).
# scripts/rxe-vm installs qemu and the guest kernel itself.
GUEST_DEBS="perftest libdapl2 ibverbs-providers librdmacm1 dapl2-utils valgrind strace"

# install_guest_debs WHO: installs the GUEST_DEBS that are missing (as root).
install_guest_debs() {
	local who=$1 p missing=""
	for p in $GUEST_DEBS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
	[ -n "$missing" ] || return 0
	echo "$who: installing$missing"
	if [ "$(id -u)" != 0 ]; then echo "$who: need root for apt-get" >&2; return 1; fi
	export DEBIAN_FRONTEND=noninteractive
	# shellcheck disable=SC2086  # a list of package names
	{ apt-get update -qq && apt-get install -y -qq $missing >/dev/null; }
}

# fail_run TAG WHY: records a failed run with its client and server output.
fail_run() {
	local tag=$1 why=$2
	{
		echo "--- $tag: $why"
		echo "client (logs/$tag-client.log):"
		sed 's/^/  | /' "logs/$tag-client.log" 2>/dev/null
		echo "server (logs/$tag-server.log):"
		sed 's/^/  | /' "logs/$tag-server.log" 2>/dev/null
	} >>failures.txt
	echo "  FAIL $tag: $why [$((SECONDS - t0)) s]"
}

# run_pair TAG READY -- SERVER... -- CLIENT...
# READY is "line:REGEX" (poll the server's log) or "tcp:PORT" (poll for a
# TCP listener). Returns 0 when server and client both succeeded.
run_pair() {
	local tag=$1 ready=$2 srv=() cli=() rc
	shift 3
	while [ "$1" != -- ]; do srv+=("$1"); shift; done
	shift
	cli=("$@")
	# Line-buffered, so a run killed by its timeout leaves what it printed.
	timeout -k 5 $((STEP_TIMEOUT + 60)) stdbuf -oL -eL "${srv[@]}" >"logs/$tag-server.log" 2>&1 &
	server_pid=$!
	case $ready in
	line:*) wait_for_line "logs/$tag-server.log" "${ready#line:}" 60 "$server_pid" ;;
	tcp:*) wait_for_listen "${ready#tcp:}" 60 "$server_pid" ;;
	esac 2>>"logs/$tag-server.log"
	rc=$?
	if [ $rc -ne 0 ]; then
		stop_pid "$server_pid"; server_pid=""
		fail_run "$tag" "server not ready"
		return 1
	fi
	timeout -k 5 "$STEP_TIMEOUT" stdbuf -oL -eL "${cli[@]}" >"logs/$tag-client.log" 2>&1
	rc=$?
	if [ $rc -ne 0 ]; then
		stop_pid "$server_pid"; server_pid=""
		if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
			fail_run "$tag" "client hung: killed after ${STEP_TIMEOUT} s"
		else
			fail_run "$tag" "client exit status $rc"
		fi
		return 1
	fi
	# The server ends by itself once its one client is done.
	wait "$server_pid"
	rc=$?
	server_pid=""
	if [ $rc -ne 0 ]; then
		fail_run "$tag" "server exit status $rc"
		return 1
	fi
	return 0
}

