# dto-cost-table.awk: the table of dto-cost.sh from its cost.txt ("TAG N KEY
# [NAME] VALUE", TAG = WHO-TEST-MODE) and rates.txt ("ROUND FIGURE WHO VALUE").
# Needs -v n1=, n2= (the two iteration counts), took=, commit=.

function per_op(tag, key) {
	if (!((tag, n1, key) in v) || !((tag, n2, key) in v)) return ""
	return (v[tag, n2, key] - v[tag, n1, key]) / (n2 - n1)
}
function dat_calls(tag) {
	return per_op(tag, "mallocs") == "" ? "" : (dat_polls[tag, n2] - dat_polls[tag, n1]) / (n2 - n1)
}
function fmt(x, d) { return x == "" ? "-" : sprintf("%." d "f", x) }
function ratio(a, b) { return (a == "" || b == "" || b <= 0) ? "-" : sprintf("%.2f", a / b) }
function sum(tag, keys,   k, i, n, s, x) {
	n = split(keys, k, " "); s = 0
	for (i = 1; i <= n; i++) { x = per_op(tag, "ir " k[i]); if (x == "") return ""; s += x }
	return s
}
function median(key,   n, i, j, t, a) {
	n = cnt[key]; if (n == 0) return ""
	for (i = 1; i <= n; i++) a[i] = r[key, i]
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function row(label, x, y, z, d) {
	printf "  %-36s %9s %9s %9s | %9s %8s\n", label, fmt(x, d), fmt(y, d), fmt(z, d), ratio(x, y), ratio(x, z)
}
FILENAME ~ /cost.txt$/ {
	if ($3 == "ir" || $3 == "calls") { key = $3 " " $4; val = $5 } else { key = $3; val = $4 }
	v[$1, $2, key] = val
	if ($3 == "calls" && $4 ~ /^dat_evd_/) dat_polls[$1, $2] += val
	next
}
{ key = $2 SUBSEP $3; r[key, ++cnt[key]] = $4 }
END {
	split("read_lat write_lat send_lat", tests, " ")
	title["read_lat"] = "8 B RDMA read"; title["write_lat"] = "8 B RDMA write ping-pong"
	title["send_lat"] = "8 B send ping-pong, receive reposted"
	printf "\nCPU cost per iteration on the verbs path (soft-RoCE guest, callgrind + strace; commit %s)\n", commit
	printf "each figure: (run of %d iterations - run of %d) / %d\n", n2, n1, n2 - n1
	for (t = 1; t <= 3; t++) for (m = 1; m <= 2; m++) {
		mode = m == 1 ? "poll" : "block"
		o = "ours-" tests[t] "-" mode; f = "ofed-" tests[t] "-" mode; w = "raw-" tests[t] "-poll"
		if (mode == "block") w = "none"
		if (per_op(o, "mallocs") == "" && per_op(f, "mallocs") == "") continue  # not measured
		printf "\n%s, %s %9s %9s %9s | %9s %8s\n", title[tests[t]],
		       mode == "poll" ? "polling (dat_evd_dequeue; raw: ibv_poll_cq)" : "blocking (dat_evd_wait)",
		       "ours", "OFED", "raw", "ours:OFED", "ours:raw"
		row("instr: libdat2 + provider", sum(o, "libdat2 provider"), sum(f, "libdat2 provider"), "", 0)
		row("instr: all but the program's own", sum(o, "libdat2 provider verbs rdmacm libc"),
		    sum(f, "libdat2 provider verbs rdmacm libc"), sum(w, "libdat2 provider verbs rdmacm libc"), 0)
		split("libdat2 provider verbs rdmacm libc", objs, " ")
		for (i = 1; i <= 5; i++)
			row("  " (objs[i] == "verbs" ? "libibverbs + rxe driver" : objs[i]), per_op(o, "ir " objs[i]),
			    per_op(f, "ir " objs[i]), per_op(w, "ir " objs[i]), 0)
		row("malloc calls", per_op(o, "mallocs"), per_op(f, "mallocs"), per_op(w, "mallocs"), 2)
		row("system calls", per_op(o, "syscalls"), per_op(f, "syscalls"), per_op(w, "syscalls"), 2)
		row("  clock_gettime (vDSO on a host)", per_op(o, "clock_gettime"), per_op(f, "clock_gettime"),
		    per_op(w, "clock_gettime"), 2)
		row("dat_evd_dequeue/_wait calls", dat_calls(o), dat_calls(f), "", 2)
	}
	printf "\nRates (medians of the rounds; higher is better)        %9s %9s %9s | %9s %8s\n", "ours", "OFED", "raw", "ours:OFED", "ours:raw"
	row("8 B RDMA write, 64 in flight (msg/s)", median("write_bw" SUBSEP "ours"), median("write_bw" SUBSEP "ofed"), median("write_bw" SUBSEP "raw"), 0)
	row("8 B send, 64 in flight (msg/s)", median("send_bw" SUBSEP "ours"), median("send_bw" SUBSEP "ofed"), median("send_bw" SUBSEP "raw"), 0)
	row("connections (dtestcm, per s)", median("cm" SUBSEP "ours"), median("cm" SUBSEP "ofed"), "", 1)
	print "\nours = datperf over rs-rxe0; OFED = the same datperf and libdat2 over ofa-v2-rxe (libdaplofa.so.2);"
	print "raw = perftest (ib_*_lat for cost, ib_*_bw -t 64 for rates). instr: user-space instructions (Ir);"
	print "an iteration is one DTO posted and reaped (write and send ping-pong: plus waiting for the peer's)."
	print "system calls: strace -f -c, sched_yield (datperf's choice between polls) and clock_gettime left out."
	print "Polling figures include the empty polls of the iterations, whose number depends on timing (the"
	print "dat_evd_* calls row; raw's ibv_poll_cq spins are not counted): compare blocking figures like for like."
	printf "Measurements took %d s in the guest.\n", took
}
