#!/bin/bash
# run-demo.sh: the two-process RDMA demo over rs-tcp with the repo's dat.conf.
# Starts the server, waits for its "listening" line (polled, bounded), runs
# the client, waits for the server, and says whether both succeeded.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
# shellcheck source=lib.sh
. "$here/lib.sh"

export LD_LIBRARY_PATH=$top/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export DAT_OVERRIDE=$top/dat.conf
demo=$top/build/bin/demo
log=$(mktemp)
server_pid=""
trap 'stop_pid "$server_pid"; rm -f "$log"' EXIT

# The server's lines go to the terminal as they come, and to $log for the
# readiness check.
timeout -k 5 60 "$demo" server > >(tee "$log") 2>&1 &
server_pid=$!
wait_for_line "$log" "listening on" 20 "$server_pid"

client_rc=0
timeout -k 5 60 "$demo" client 127.0.0.1 || client_rc=$?
server_rc=0
wait "$server_pid" || server_rc=$?
server_pid=""
wait        # tee, so that its last lines come before the verdict

if [ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ]; then
	echo "demo: SUCCESS (client and server exited 0)"
else
	echo "demo: FAILED (client exit $client_rc, server exit $server_rc)" >&2
	exit 1
fi
