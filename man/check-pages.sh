#!/bin/sh
# man/check-pages.sh (`make man-check`, part of `make test`): every export
# of the two registry libraries has a man page, and every page is clean.
#
# 1. The exports are the names in the `global:` sections of the version
#    scripts the libraries are linked with, src/libdat2/libdat2.map
#    (DAT_2.0) and src/libdat/libdat.map (DAT_1.2): exactly what `nm -D`
#    shows, without building anything. A version script does not say which
#    names are functions; every name there today is one, and a data symbol
#    added later needs a page too (or a line in EXEMPT below, with the
#    reason). Wildcard patterns (`*`, `?`, `[`), the `local:` section and
#    `extern "C++"` blocks export no name of their own and are skipped.
# 2. An export is covered by man/man3/<name>.3, a page of its own or a
#    one-line `.so man3/<other>.3` link to the page that documents it with
#    others (dat_ia_open, the IB extension macros): one file per name, so
#    that `man <name>` finds it with any man(1), no whatis index needed. A
#    link's target must exist and list the name in its NAME line.
# 3. man/man3 is what man/gen-pages.py writes from man/calls.in and the
#    headers (python3 needed; skipped, saying so, without it).
# 4. Every page under man/ formats without a warning:
#    `groff -man -Tutf8 -ww -z` (or `mandoc -Tlint` where groff is missing;
#    skipped, saying so, when neither is installed).
# Exit status: 0 when all hold, 1 otherwise, naming what failed.
set -u
man=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$man")
EXEMPT="" # names that need no page: none
failed=0
fail() {
	echo "man-check: $*" >&2
	failed=1
}

# --- 1 and 2: every export has a page
exports() {
	awk '
		/extern[ \t]+"C\+\+"/ { cxx = 1 }
		cxx { if ($0 ~ /}/) cxx = 0; next }
		/^[ \t]*global:/ { global = 1; sub(/^[ \t]*global:/, "") }
		/^[ \t]*local:/ { global = 0 }
		/^[ \t]*}/ { global = 0 }
		global {
			n = split($0, w, /[ \t;]+/)
			for (i = 1; i <= n; i++)
				if (w[i] != "" && w[i] !~ /[*?\[]/) print w[i]
		}
	' "$@" | sort -u
}
names=$(exports "$top/src/libdat2/libdat2.map" "$top/src/libdat/libdat.map")
[ -n "$names" ] || fail "no exports found in the version scripts"
missing=""
count=0
for n in $names; do
	case " $EXEMPT " in *" $n "*) continue ;; esac
	count=$((count + 1))
	page="$man/man3/$n.3"
	if [ ! -f "$page" ]; then
		missing="$missing $n"
		continue
	fi
	target=$(sed -n '1s/^\.so[ \t]*//p' "$page")
	if [ -n "$target" ]; then
		if [ ! -f "$man/$target" ]; then
			fail "$n.3 links to $target, which does not exist"
		elif ! sed -n '/^\.SH NAME/,/^\.SH/p' "$man/$target" | grep -qw "$n"; then
			fail "$n.3 links to $target, whose NAME line does not list $n"
		fi
	fi
done
[ -z "$missing" ] || fail "exports without a page in man/man3:$missing"

# --- 3: the generated pages are current
if command -v python3 >/dev/null 2>&1; then
	python3 "$man/gen-pages.py" --check || fail "man/man3 is not what man/gen-pages.py writes"
else
	echo "man-check: SKIPPED the generated-pages check: no python3" >&2
fi

# --- 4: every page formats without warnings (.so resolves from man/)
pages=$(cd "$man" && ls man1/*.1 man3/*.3 man5/*.5 man7/*.7 2>/dev/null)
if command -v groff >/dev/null 2>&1; then
	lint() { groff -man -Tutf8 -ww -z "$1" 2>&1; }
	linter=groff
elif command -v mandoc >/dev/null 2>&1; then
	lint() { mandoc -Tlint -W warning "$1" 2>&1; }
	linter=mandoc
else
	linter=""
	echo "man-check: SKIPPED the lint of the pages: neither groff nor mandoc is installed (apt-get install groff-base)" >&2
fi
linted=0
if [ -n "$linter" ]; then
	for p in $pages; do
		out=$(cd "$man" && lint "$p")
		[ -z "$out" ] || fail "$p: $linter warns:
$out"
		linted=$((linted + 1))
	done
fi

if [ $failed -ne 0 ]; then
	echo "man-check: FAILED" >&2
	exit 1
fi
echo "man-check: $count exports, each with a page; $linted pages linted${linter:+ by $linter}"
