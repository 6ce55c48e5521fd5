# Shell helpers shared by run-bench.sh and run-demo.sh (sourced, not run).

# wait_for_line FILE REGEX SECONDS PID
# Polls until FILE holds a line matching REGEX (a server's "listening" line).
# Fails at once if PID exits first, and after SECONDS at the latest.
wait_for_line() {
	local file=$1 re=$2 secs=$3 pid=$4
	local deadline=$((SECONDS + secs))

	until grep -q -- "$re" "$file" 2>/dev/null; do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "error: the server exited before it was ready:" >&2
			sed 's/^/  | /' "$file" >&2
			return 1
		fi
		if ((SECONDS >= deadline)); then
			echo "error: no '$re' from the server within $secs s" >&2
			return 1
		fi
		sleep 0.05
	done
}

# wait_for_listen PORT SECONDS PID
# Polls /proc/net/tcp{,6} until something listens on TCP PORT (for servers
# such as qperf's that print nothing when ready).
wait_for_listen() {
	local port=$1 secs=$2 pid=$3
	local hex deadline=$((SECONDS + secs))

	hex=$(printf ':%04X' "$port")
	# Field 2 is local_address:port, field 4 the state (0A = LISTEN).
	until awk -v p="$hex" '$2 ~ p"$" && $4 == "0A" { found = 1 } END { exit !found }' \
		/proc/net/tcp /proc/net/tcp6 2>/dev/null; do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "error: the server on port $port exited before it listened" >&2
			return 1
		fi
		if ((SECONDS >= deadline)); then
			echo "error: nothing listens on port $port after $secs s" >&2
			return 1
		fi
		sleep 0.05
	done
}

# stop_pid PID: ends a background process we started, and reaps it.
stop_pid() {
	local pid=$1

	[ -n "$pid" ] || return 0
	if kill -0 "$pid" 2>/dev/null; then
		kill "$pid" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null || true
}

# awk_rounds: the start of an awk program reading "WHERE KEY VALUE" lines (one figure of
# one round each) into v[] and n[], with med(where, key), the median of a figure's rounds
# ("" when none), and f(x, d), x with d decimals ("-" when empty).
awk_rounds='
	{ k = $1 SUBSEP $2; v[k, ++n[k]] = $3 }
	function med(s, key,   k, c, i, j, a, t) {
		k = s SUBSEP key; c = n[k]
		if (!c) return ""
		for (i = 1; i <= c; i++) a[i] = v[k, i]
		for (i = 2; i <= c; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
		return c % 2 ? a[(c + 1) / 2] : (a[c / 2] + a[c / 2 + 1]) / 2
	}
	function f(x, d) { return x == "" ? "-" : sprintf("%." d "f", x) }
'
