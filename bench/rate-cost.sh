#!/bin/bash
# rate-cost.sh: what one message of the message-rate test costs the CPU on the verbs path
# (issue 21), in the soft-RoCE guest. dto-cost.sh counts ping-pongs (pipeline 1); this
# counts the 64-in-flight runs whose rate it times: datperf -p -w 64, 8 B, the sender of
# send_bw and write_bw under callgrind (the peer native), twice (RC_N1 and RC_N2
# messages), ours (rs-rxe0) and OFED's (ofa-v2-rxe through the same datperf and libdat2).
#
# Per call, inclusive (libdat2, the provider, libibverbs and rxe's driver):
# dat_ep_post_send / dat_ep_post_rdma_write, and dat_evd_dequeue split into the two kinds
# of call a poller makes: one that finds an event (F) and one that finds none (E), solved
# from the two runs (calls = found + empty, found = messages + the control events), since
# the number of empty polls depends on timing and set-up does not cancel otherwise.
#
#   bench/rate-cost.sh                 boots a guest, prints the table
#   bench/rate-cost.sh --inside DIR    in a guest already up
#   bench/rate-cost.sh --host [DIR]    ours over rs-tcp on this host, in a private network
#                                      namespace (as root; no guest): libdat2, the core and
#                                      the boundary are the same code as on verbs, so their
#                                      share is counted here; the backend's is TCP's
#
# Env: RC_N1 (200), RC_N2 (600), RC_WHO ("ours ofed"), RC_TESTS ("send_bw write_bw"),
#      STEP_TIMEOUT (300 s per client). Output: DIR/rate-cost.txt, callgrind files in
#      DIR/cg (default DIR: build/bench/rate-cost).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
# shellcheck source=guest-lib.sh
. "$here/guest-lib.sh"
RC_N1=${RC_N1:-200}
RC_N2=${RC_N2:-600}
RC_WHO=${RC_WHO:-ours ofed}
RC_TESTS=${RC_TESTS:-send_bw write_bw}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
# Control events a client reaps besides its messages' (the server's ready; send_bw: done).
CTRL_EVENTS=3
export RC_N1 RC_N2 RC_WHO RC_TESTS STEP_TIMEOUT

if [ "${1:-}" = --host ]; then
	out=${2:-$top/build/bench/rate-cost-host}
	rm -rf "$out"
	mkdir -p "$out"
	# shellcheck disable=SC2016  # expanded by the inner shell
	unshare -n sh -c 'ip link set lo up && exec "$0" --inside-host "$1"' "$0" "$out" || exit 1
	cat "$out/rate-cost.txt"
	exit 0
fi
if [ "${1:-}" != --inside ] && [ "${1:-}" != --inside-host ]; then
	out=$top/build/bench/rate-cost
	install_guest_debs rate-cost || exit 1
	rm -rf "$out"
	mkdir -p "$out"
	"$top/scripts/rxe-vm" -t 1800 -w "$out" -- "$here/rate-cost.sh" --inside "$out"
	[ -s "$out/rate-cost.txt" ] || { echo "rate-cost: the guest did not finish" >&2; exit 1; }
	cat "$out/rate-cost.txt"
	exit 0
fi

out=$2
# shellcheck source=lib.sh
. "$here/lib.sh"
mkdir -p "$out/logs" "$out/cg"
cd "$out" || exit 1
: >failures.txt
: >rate-cost.txt
if [ "$1" = --inside-host ]; then
	OURS=rs-tcp ADDR=127.0.0.1 RC_WHO=ours
	echo "$OURS u2.0 nonthreadsafe default libdaplrs.so.2 dapl.2.0 \"tcp lo\" \"\"" >dat.conf
else
	cat >dat.conf <<EOF
$OURS u2.0 nonthreadsafe default libdaplrs-verbs.so.2 dapl.2.0 "verbs $DEV 1" ""
$OFED u2.0 nonthreadsafe default libdaplofa.so.2 dapl.2.0 "rxenet0 0" ""
EOF
fi
export LD_LIBRARY_PATH=$top/build/lib DAT_OVERRIDE=$out/dat.conf
datperf=$top/build/bin/datperf
server_pid=""
trap 'stop_pid "$server_pid"' EXIT
t0=$SECONDS

# incl_calls FILE FUNC: "INCLUSIVE CALLS" of libdat2's export FUNC (its callers' calls summed;
# the largest entry: callgrind also lists parts inlined elsewhere under the same name).
incl_calls() {
	callgrind_annotate --tree=caller --inclusive=yes --threshold=100 "$1" 2>/dev/null |
		awk -v fn="$2" '
		/^ *[0-9,]+ .*  < / { n = $0; sub(/.*\(/, "", n); sub(/x\).*/, "", n); gsub(",", "", n); calls += n; next }
		/ \* / && $0 ~ ("exports\\.rs:" fn "( |$)") { gsub(",", "", $1); if ($1 + 0 > best) { best = $1 + 0; n_best = calls } }
		{ calls = 0 }
		END { print best, n_best }'
}

commit=$(git -C "$top" describe --always --dirty 2>/dev/null || echo '?')
echo "rate-cost at $commit: instructions per call, $RC_N1 and $RC_N2 messages, 64 in flight" >>rate-cost.txt
for t in $RC_TESTS; do
	post=dat_ep_post_send
	[ "$t" = write_bw ] && post=dat_ep_post_rdma_write
	for who in $RC_WHO; do
		ia=$OURS
		[ "$who" = ofed ] && ia=$OFED
		for n in $RC_N1 $RC_N2; do
			run_pair "$t-$who-$n" "line:server listening" \
				-- "$datperf" -P "$ia" -s -q 18525 -t "$t" -S 8 -A 120 -p \
				-- valgrind -q --tool=callgrind --callgrind-out-file="cg/$t-$who-$n.out" \
				"$datperf" -P "$ia" -h $ADDR -q 18525 -t "$t" -S 8 -N "$n" -B 0 -w 64 -p ||
				continue 2
			echo "  ok   $t-$who-$n [$((SECONDS - t0)) s]"
		done
		read -r p1 pc1 <<<"$(incl_calls "cg/$t-$who-$RC_N1.out" $post)"
		read -r p2 pc2 <<<"$(incl_calls "cg/$t-$who-$RC_N2.out" $post)"
		read -r d1 dc1 <<<"$(incl_calls "cg/$t-$who-$RC_N1.out" dat_evd_dequeue)"
		read -r d2 dc2 <<<"$(incl_calls "cg/$t-$who-$RC_N2.out" dat_evd_dequeue)"
		awk -v t="$t" -v who="$who" -v post="$post" -v p1="$p1" -v pc1="$pc1" -v p2="$p2" -v pc2="$pc2" \
			-v d1="$d1" -v c1="$dc1" -v d2="$d2" -v c2="$dc2" \
			-v f1=$((RC_N1 + CTRL_EVENTS)) -v f2=$((RC_N2 + CTRL_EVENTS)) 'BEGIN {
			e1 = c1 - f1; e2 = c2 - f2; det = e1 * f2 - e2 * f1
			printf "%-9s %-5s %-23s %6.0f | dat_evd_dequeue found %6.0f empty %5.0f | per message %6.0f\n",
				t, who, post, (p2 - p1) / (pc2 - pc1),
				det ? (e1 * d2 - e2 * d1) / det : 0, det ? (d1 * f2 - d2 * f1) / det : 0,
				(p2 + d2) / f2 }' >>rate-cost.txt
	done
done
echo "per message: the $RC_N2-message run's posts and dequeues (empty ones included) over its events" >>rate-cost.txt
sync
exit 0
