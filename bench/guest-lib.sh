# Shell helpers of the soft-RoCE guest's benchmarks (run-bench-guest.sh,
# dto-cost.sh), sourced after lib.sh, in the directory that holds logs/ and
# failures.txt. They use STEP_TIMEOUT (seconds per client), t0 (the start,
# in $SECONDS) and server_pid (the server to stop on exit).

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

