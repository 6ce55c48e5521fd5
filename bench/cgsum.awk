# cgsum.awk: sums a callgrind output file (callgrind's own format, names
# compressed or not, `positions: line`, event Ir) by object, and counts the
# calls made to the malloc family, and the program's own calls to the
# functions named in COUNT (an awk regex on the callee's name, e.g.
# -v COUNT='^(dat_evd_dequeue|dat_evd_wait)$').
#
#   awk -f cgsum.awk [-v COUNT=REGEX] callgrind.out.PID
#
# prints "ir GROUP N" per object group (libdat2, provider, verbs, rdmacm,
# libc, app, other), "mallocs N" and "calls NAME N". Self cost only: the
# cost line after a `calls=` line is the callee's inclusive cost and is
# skipped. Objects are summed from `ob=` (callgrind_annotate leaves inlined
# frames of another file without an object; this does not).

function name_of(spec, table,   id, rest) {
	# "(12) /path/name" defines id 12, "(12)" refers to it, "name" is plain.
	if (match(spec, /^\([0-9]+\)/)) {
		id = substr(spec, 2, RLENGTH - 2)
		rest = substr(spec, RLENGTH + 1)
		sub(/^ /, "", rest)
		if (rest != "") names[table, id] = rest
		return names[table, id]
	}
	return spec
}
function group_of(ob,   base) {
	base = ob; sub(/.*\//, "", base)
	if (base ~ /^libdat2?\.so/) return "libdat2"
	if (base ~ /^libdapl/) return "provider"
	if (base ~ /^libibverbs|rdmav[0-9]*\.so|^librxe/) return "verbs"
	if (base ~ /^librdmacm/) return "rdmacm"
	if (base ~ /^(libc\.so|ld-linux|libm\.so|libpthread|libgcc_s)/) return "libc"
	if (base ~ /^(datperf|regcost|ib_[a-z_]+|dapltest|dtest)/) return "app"
	return "other"
}
function value(s) { return s + 0 }
BEGIN { skip_next = 0; group = "other" }
/^ob=/ { ob = name_of(substr($0, 4), "ob"); group = group_of(ob); next }
/^fn=/ { fname = name_of(substr($0, 4), "fn"); sub(/'[0-9]+$/, "", fname); next }
/^cfn=/ { callee = name_of(substr($0, 5), "fn"); sub(/'[0-9]+$/, "", callee); next }
/^(cob|cfi|cfl)=/ { name_of(substr($0, index($0, "=") + 1), substr($0, 1, 3) == "cob" ? "ob" : "fl"); next }
/^(fl|fi|fe)=/ { name_of(substr($0, 4), "fl"); next }
/^calls=/ {
	n = substr($1, 7) + 0
	if (callee ~ /^(malloc|calloc|realloc|posix_memalign|aligned_alloc|memalign)$/ &&
	    fname !~ /^(malloc|calloc|realloc|posix_memalign|aligned_alloc|memalign)$/)
		mallocs += n
	# Calls the program makes (libdat2 has inner functions of the same names).
	if (COUNT != "" && callee ~ COUNT && group == "app") counted[callee] += n
	skip_next = 1
	next
}
/^([0-9]|\+|-|\*)/ {
	if (skip_next) { skip_next = 0; next }
	ir[group] += value($2)
	next
}
END {
	split("libdat2 provider verbs rdmacm libc app other", order, " ")
	for (i = 1; i <= 7; i++) printf "ir %s %d\n", order[i], ir[order[i]]
	printf "mallocs %d\n", mallocs
	for (f in counted) printf "calls %s %d\n", f, counted[f]
}
