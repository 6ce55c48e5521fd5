# Sourced by deb-check.sh and rpm-check.sh (after they set $top): the throw-away
# Debian 12 root both install our packages into, with Debian's libdapl2 (OFED's
# registry, providers and /etc/dat.conf), dapl2-utils, libfabric1, iproute2 and
# man-db. Debian's packages are downloaded from DEB_CHECK_MIRROR once, into
# DEB_CHECK_TARBALL (build/deb-check/bookworm.tgz), then unpacked from it without
# the network.
bookworm_mirror=${DEB_CHECK_MIRROR:-http://deb.debian.org/debian}
bookworm_tarball=${DEB_CHECK_TARBALL:-$top/build/deb-check/bookworm.tgz}
bookworm_include=libdapl2,dapl2-utils,libfabric1,iproute2,man-db

# bookworm_root ROOT LOGDIR SCRATCH: makes the root ROOT (debootstrap's logs in
# LOGDIR, a first download in SCRATCH). On failure prints why and returns 1.
bookworm_root() {
	local root=$1 logs=$2 dl=$3
	command -v debootstrap > /dev/null ||
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap > /dev/null ||
		{ echo "cannot install debootstrap"; return 1; }
	if [ ! -s "$bookworm_tarball" ]; then
		mkdir -p "$(dirname "$bookworm_tarball")"
		if ! debootstrap --variant=minbase --include=$bookworm_include \
			--make-tarball="$bookworm_tarball.tmp" bookworm "$dl" "$bookworm_mirror" \
			> "$logs/debootstrap-dl.log" 2>&1; then
			echo "debootstrap could not download bookworm: $(tail -2 "$logs/debootstrap-dl.log")"
			rm -f "$bookworm_tarball.tmp"
			return 1
		fi
		mv "$bookworm_tarball.tmp" "$bookworm_tarball"
		rm -rf "$dl"
	fi
	if ! debootstrap --variant=minbase --include=$bookworm_include \
		--unpack-tarball="$bookworm_tarball" bookworm "$root" "$bookworm_mirror" \
		> "$logs/debootstrap.log" 2>&1; then
		echo "debootstrap: $(tail -2 "$logs/debootstrap.log")"
		return 1
	fi
}
