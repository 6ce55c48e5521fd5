#!/usr/bin/env bash
# pass-list.sh: reads the pass files of tests-c/passes/ (its README.md says
# how they are written). The Makefile and verbs-guest.sh read them through it.
#
#   pass-list.sh NAME     what pass NAME runs, in order, one name a line:
#                         programs (built as build/tests/NAME) and scripts
#                         (tests-c/scripts/NAME: the names with a dot). For
#                         passes/NAME.pass: every test of provider-tests.list
#                         but its -NAME lines, in that list's order, then its
#                         +NAME lines; for passes/NAME.subset: its lines.
#   pass-list.sh --check  every pass file well formed (one name a line, each
#                         an existing program source or script, none twice,
#                         a reason on each -NAME line; in a *.pass only -NAME
#                         lines of provider-tests.list and +NAME lines of
#                         tests not in it)
set -u
dir=$(cd "$(dirname "$0")/../passes" && pwd) || exit 1
tests=$(dirname "$dir")

# entries FILE: its lines without comments and blank lines ("NAME" or "-NAME")
entries() { sed -e 's/#.*//' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' -e '/^$/d' "$1"; }

if [ "${1:-}" != --check ]; then
	if [ $# -ne 1 ] || [ -z "$1" ]; then
		echo "usage: $0 NAME | --check" >&2
		exit 2
	fi
	for f in "$dir/$1.pass" "$dir/$1.subset" ""; do [ -f "$f" ] && break; done
	if [ -z "$f" ]; then
		echo "pass-list: no pass $1 (neither $dir/$1.pass nor $1.subset)" >&2
		exit 1
	fi
	case $f in
	*.pass)
		# no process substitution: the guest's root has no /dev/fd
		left_out=$(entries "$f" | sed -n 's/^-//p')
		runs=$(
			entries "$dir/provider-tests.list" |
				awk -v out="$left_out" 'BEGIN { n = split(out, a); for (i = 1; i <= n; i++) skip[a[i]] = 1 } !($0 in skip)'
			entries "$f" | sed -n 's/^+//p'
		)
		;;
	*) runs=$(entries "$f" | grep -v '^-') ;;
	esac
	if [ -z "$runs" ]; then
		echo "pass-list: $f runs nothing" >&2
		exit 1
	fi
	printf '%s\n' "$runs"
	exit 0
fi

errors=0
err() {
	echo "pass-list: $*" >&2
	errors=$((errors + 1))
}
# exists NAME: a program source of programs/ or a script of scripts/
exists() {
	case $1 in
	*.*) [ -f "$tests/scripts/$1" ] ;;
	*) [ -f "$tests/programs/$1.c" ] ;;
	esac
}

kind=$(entries "$dir/provider-tests.list")
for t in $kind; do exists "$t" || err "provider-tests.list: $t: no programs/$t.c or scripts/$t"; done
files=0
for f in "$dir"/*.pass "$dir"/*.subset; do
	[ -f "$f" ] || continue
	files=$((files + 1))
	base=${f##*/}
	declare -A seen=()
	n=0
	while IFS= read -r raw || [ -n "$raw" ]; do
		n=$((n + 1))
		line=$(sed -e 's/#.*//' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' <<<"$raw")
		[ -n "$line" ] || continue
		case $line in
		*[[:space:]]*) err "$base:$n: one name a line, not '$line'"; continue ;;
		esac
		name=${line#[-+]}
		exists "$name" || err "$base:$n: $name: no programs/$name.c or scripts/$name"
		[ -n "${seen[$name]:-}" ] && err "$base:$n: $name named twice"
		seen[$name]=1
		if [ "${line:0:1}" = - ] && ! grep -Eq '#[[:space:]]*[^[:space:]]' <<<"$raw"; then
			err "$base:$n: -$name without a reason (-$name  # why)"
		fi
		case $base in
		*.pass)
			listed=no
			grep -qxF "$name" <<<"$kind" && listed=yes
			case ${line:0:1}$listed in
			-yes | +no) ;;
			-no) err "$base:$n: -$name: not in provider-tests.list, so never run here anyway" ;;
			+yes) err "$base:$n: +$name: in provider-tests.list, so run here already" ;;
			*) err "$base:$n: $name: a *.pass has only -NAME (left out) and +NAME (added) lines" ;;
			esac
			;;
		esac
	done < "$f"
	[ -n "$("$0" "${base%.*}" 2>/dev/null)" ] || err "$base runs nothing"
	unset seen
done
if [ $errors -ne 0 ]; then
	echo "pass-list: $errors errors in $dir" >&2
	exit 1
fi
echo "pass-list: $files pass files in $dir well formed"
