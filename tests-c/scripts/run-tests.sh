#!/usr/bin/env bash
# Runs the C tests and conformance checks given as arguments (programs or
# scripts), each under a timeout, and adds up their "N passed, N failed"
# lines into one total line, "$RUN_TESTS_NAME: N passed, N failed"
# (default name tests-c). Each runs under $RUN_TESTS_TIMEOUT seconds
# (default 120).
set -u
name=${RUN_TESTS_NAME:-tests-c}
limit=${RUN_TESTS_TIMEOUT:-120}
passed=0 failed=0
failures=""
for t in "$@"; do
	echo "== $t"
	out=$(timeout "$limit" "$t" 2>&1); rc=$?
	printf '%s\n' "$out"
	line=$(printf '%s\n' "$out" | grep -E '[0-9]+ passed, [0-9]+ failed' | tail -1)
	if [ -n "$line" ]; then
		p=$(sed -E 's/.* ([0-9]+) passed, ([0-9]+) failed.*/\1/' <<<"$line")
		f=$(sed -E 's/.* ([0-9]+) passed, ([0-9]+) failed.*/\2/' <<<"$line")
	else
		p=0 f=1
	fi
	# a crash or timeout after a clean summary still counts as a failure
	if [ $rc -ne 0 ] && [ "$f" = 0 ]; then f=1; echo "$t: exit status $rc"; fi
	passed=$((passed + p)) failed=$((failed + f))
	# repeated at the end so the tail of a CI log names what failed
	if [ "$f" != 0 ]; then
		failures+="== $t: $f failed (exit status $rc)"$'\n'
		failures+=$(printf '%s\n' "$out" | grep -E -i 'FAIL|error|timed out' | grep -v -E '[0-9]+ passed, 0 failed' | head -20)$'\n'
	fi
done
if [ -n "$failures" ]; then
	echo "$name: failures, again:"
	printf '%s' "$failures"
fi
echo "$name: $passed passed, $failed failed"
[ $failed -eq 0 ]
