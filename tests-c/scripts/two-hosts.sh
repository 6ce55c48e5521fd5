#!/usr/bin/env bash
# Two hosts on one machine: network namespaces joined by a veth pair, made
# here and removed on exit. A dapltest server runs in one, the transaction
# tests run from the other, each with its own dat.conf naming its own
# interface ("tcp veth..."), so the IA addresses are the hosts' addresses.
# Addresses come from TEST-NET-2 (198.51.100.0/24), only inside these
# namespaces.
#
# TWO_HOSTS_BACKEND=ofi (ofi-two-hosts.sh): the same over the libfabric entry
# rs-ofi-tcp ("ofi tcp veth..."): libfabric's tcp provider over the veth pair.
# TWO_HOSTS_BACKEND=ofi-rxm (ofi-two-hosts.sh with DAT_TEST_IA=rs-ofi-rxm):
# over rs-ofi-rxm ("ofi tcp;ofi_rxm veth..."): reliable datagrams with our
# connection layer on top, its handshake between the two hosts' addresses.
set -u
# Two "hosts" in namespaces of one machine: the TCP path is what is under test, so the
# same-host path (which would otherwise carry RDMA between them) is turned off.
export DAPLRS_SAME_HOST=never
top=$(cd "$(dirname "$0")/../.." && pwd)
name=two-hosts ia=rs-tcp lib=libdaplrs.so.2 where=tcp
if [ "${TWO_HOSTS_BACKEND:-tcp}" = ofi ]; then
	name=ofi-two-hosts ia=rs-ofi-tcp lib=$top/build/lib/libdaplrs-ofi.so.2 where="ofi tcp"
elif [ "${TWO_HOSTS_BACKEND:-tcp}" = ofi-rxm ]; then
	name=ofi-rxm-two-hosts ia=rs-ofi-rxm lib=$top/build/lib/libdaplrs-ofi.so.2 where="ofi tcp;ofi_rxm"
fi
out="$top/build/tests/$name"
mkdir -p "$out"
tag=udrs$$
a=${tag}a b=${tag}b
passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "$name: FAIL: $*"; }
cleanup() {
	[ -n "${server_pid:-}" ] && kill "$server_pid" 2>/dev/null
	ip netns del "$a" 2>/dev/null
	ip netns del "$b" 2>/dev/null
}
trap cleanup EXIT

if ! ip netns add "$a" || ! ip netns add "$b"; then
	echo "$name: cannot create network namespaces (need root and iproute2)"
	echo "$name: 0 passed, 1 failed"
	exit 1
fi
ip link add veth-$a netns "$a" type veth peer name veth-$b netns "$b"
ip -n "$a" addr add 198.51.100.1/24 dev veth-$a
ip -n "$b" addr add 198.51.100.2/24 dev veth-$b
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set veth-$a up
ip -n "$b" link set veth-$b up

for side in a b; do
	ns=${tag}$side
	echo "$ia u2.0 nonthreadsafe default $lib dapl.2.0 \"$where veth-$ns\" \"\"" > "$out/dat.conf.$side"
done
in_ns() {
	local side=$1; shift
	ip netns exec ${tag}$side env LD_LIBRARY_PATH="$top/build/lib" DAT_OVERRIDE="$out/dat.conf.$side" "$@"
}

# Each host sees its own address as its IA address.
info=$(in_ns a "$top/build/bin/datinfo" 2>&1)
grep -q "IA address 198.51.100.1" <<<"$info" && ok || bad "host a IA address: $info"

in_ns a timeout 300 dapltest -T S -D $ia > "$out/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do grep -q "Service Point Ready" "$out/server.log" && break; sleep 0.1; done
grep -q "Service Point Ready" "$out/server.log" && ok || bad "server not ready (see $out/server.log)"

run() {
	local name=$1; shift
	if in_ns b timeout 120 "$@" > "$out/$name.log" 2>&1; then ok; else bad "$name exit $? (see $out/$name.log)"; fi
}
s=198.51.100.1
run T-SR dapltest -T T -s $s -D $ia -i 100 -t 1 -w 1 client SR 256 1 server SR 256 1
run T-validate dapltest -T T -s $s -D $ia -i 100 -t 1 -w 1 -V -P client SR 1024 -f server SR 1536 2 -f
run T-RW-RR dapltest -T T -P -t 1 -w 1 -i 1024 -s $s -D $ia client RW 4096 1 server RW 2048 4 server RR 1024 1 client RR 2048 1 client SR 1024 3 -f server SR 256 3 -f
run T-4x4 dapltest -T T -s $s -D $ia -i 1024 -t 4 -w 4 client SR 8192 3 server SR 8192 3
run Q dapltest -T Q -s $s -D $ia
if wait "$server_pid"; then ok; else bad "server exit status (see $out/server.log)"; fi
server_pid=
echo "$name: $passed passed, $failed failed"
