#!/usr/bin/env python3
"""The STags RDMA reads put on the wire, seen from the wire (issue 38).

Runs build/tests/test_read_sink_wire (on $DAT_TEST_IA, an iWARP entry) while
capturing every TCP segment on the host (AF_PACKET; root), then finds each
RDMA Read Request in the captured bytes by its source STag and tagged offset
(RFC 5040: sink STag 4 B, sink offset 8 B, size 4 B, source STag 4 B, source
offset 8 B, big-endian) and checks its sink: neither the consumer's
lmr_context nor an offset inside the consumer's region may go out (a peer on
siw could read the region with them). Fails if it sees no read request: a
capture that saw nothing proves nothing.
"""
import os
import socket
import struct
import subprocess
import sys
import threading

ETH_P_ALL = 0x0003
here = os.path.dirname(os.path.abspath(__file__))
prog = os.path.join(here, "..", "..", "build", "tests", "test_read_sink_wire")
passed = failed = 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("  FAIL read-sink-wire: " + what)


def tcp_payload(frame):
    """The TCP payload of an Ethernet/IPv4 frame, or None."""
    if len(frame) < 34 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[14:]
    ihl = (ip[0] & 0x0F) * 4
    if ip[9] != 6:
        return None
    total = struct.unpack(">H", ip[2:4])[0]
    tcp = ip[ihl:total]
    if len(tcp) < 20:
        return None
    return tcp[(tcp[12] >> 4) * 4:]


def capture(sock, stop, out):
    while not stop.is_set():
        try:
            frame = sock.recv(65536)
        except socket.timeout:
            continue
        p = tcp_payload(frame)
        if p:
            out.append(p)


def main():
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(socket.SOL_SOCKET, 33, 32 << 20)  # SO_RCVBUFFORCE: keep every frame
    sock.settimeout(0.1)
    stop, payloads = threading.Event(), []
    t = threading.Thread(target=capture, args=(sock, stop, payloads))
    t.start()
    run = subprocess.run([prog], capture_output=True, text=True, timeout=150)
    stop.set()
    t.join()
    sys.stdout.write(run.stdout)
    sys.stdout.write(run.stderr)
    check(run.returncode == 0, "test_read_sink_wire exited %d" % run.returncode)
    sink = source = None
    for line in run.stdout.splitlines():
        f = line.split()
        if f[:1] == ["sink"]:
            sink = (int(f[1], 16), int(f[2], 16), int(f[3]))
        elif f[:1] == ["source"]:
            source = (int(f[1], 16), int(f[2], 16))
    check(sink is not None and source is not None, "the program printed no sink or source")
    if sink is None or source is None:
        return
    lmr_context, base, length = sink
    src_stag = struct.pack(">I", source[0])
    requests = 0
    for p in payloads:
        at = p.find(src_stag)
        while at >= 16:
            src_to = struct.unpack(">Q", p[at + 4:at + 12])[0] if at + 12 <= len(p) else 0
            if source[1] <= src_to < source[1] + 8192:
                requests += 1
                stag, to = struct.unpack(">IQ", p[at - 16:at - 4])
                print("read-sink-wire: read request from %#x: sink STag %#x, offset %#x" % (src_to, stag, to))
                check(stag != lmr_context, "the sink's lmr_context %#x went out" % stag)
                check(not base <= to < base + length,
                      "sink offset %#x (STag %#x) names the consumer's region" % (to, stag))
            at = p.find(src_stag, at + 1)
    # Two reads (lo may show each frame twice); fewer means the capture missed them.
    check(requests >= 2, "%d read requests seen on the wire, want 2 or more" % requests)


if __name__ == "__main__":
    main()
    print("read-sink-wire: %d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)
