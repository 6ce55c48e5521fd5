#!/bin/sh
# Reserves the fixed ports Debian's test programs listen on inside the
# kernel's ephemeral range (dtest, dtestcm and dtestsrq: 45248), so that no
# outgoing connection of another test is given one of them as its local port.
# Such a connection leaves the port in TIME_WAIT for a minute after it closes,
# and if its socket did not set SO_REUSEADDR (ours do; the Rust tests' and the
# fuzzer's plain peers do not), the kernel refuses the program's listener with
# EADDRINUSE (DAT_CONN_QUAL_IN_USE): seen in CI after the fuzzer's live-engine
# targets made thousands of connections. Adds to
# net.ipv4.ip_local_reserved_ports (what is there stays); needs root, and says
# so when it cannot.
f=/proc/sys/net/ipv4/ip_local_reserved_ports
ports="45248"
if [ ! -w "$f" ]; then
	echo "reserve-ports: cannot write $f (not root?): ports $ports may be taken by other connections"
	exit 0
fi
cur=$(cat "$f")
add=""
for p in $ports; do
	held=no
	for item in $(echo "$cur" | tr ',' ' '); do
		lo=${item%-*} hi=${item#*-}
		if [ "$p" -ge "$lo" ] && [ "$p" -le "$hi" ]; then held=yes; fi
	done
	[ $held = no ] && add="$add,$p"
done
[ -z "$add" ] && exit 0
if [ -n "$cur" ]; then new="$cur$add"; else new=${add#,}; fi
echo "$new" > "$f" && echo "reserve-ports: reserved $(echo "${add#,}" | tr ',' ' ') (net.ipv4.ip_local_reserved_ports: $new)"
