# udapl-rs: `make` builds, `make test` installs what it needs and tests.
#
# Outputs land in build/: build/lib/libdat2.so.2 (+ libdat2.so), the DAT 1.2
# registry build/lib/libdat.so.1 (+ libdat.so), the provider
# build/lib/libdaplrs.so.2, build/bin/ tools, build/tests/ C tests.

PREFIX      ?= /usr/local
LIBDIR      ?= $(PREFIX)/lib
INCLUDEDIR  ?= $(PREFIX)/include
BINDIR      ?= $(PREFIX)/bin
MANDIR      ?= $(PREFIX)/share/man
# The dat.conf DAT registries (ours and OFED's) read when DAT_OVERRIDE is unset;
# empty (make install DATCONF=): install and uninstall leave dat.conf alone
# (the Debian packages register the providers in their maintainer scripts).
DATCONF     ?= /etc/dat.conf
CARGO       ?= cargo
CC          ?= cc
CFLAGS      ?= -O2 -g -Wall -Wextra
PROFILE     ?= release

BUILD       := build
LIB         := $(BUILD)/lib
OBJ         := $(BUILD)/obj
TARGET      := target/$(PROFILE)
CARGO_FLAGS := $(if $(filter release,$(PROFILE)),--release,)

# Debian packages `make test` needs: the C toolchain, OFED's headers and
# library (ABI comparison, third-party provider), the conformance suite,
# iproute2 for the two-host test in network namespaces, and xz-utils to
# unpack Debian's dapl source (tests-c/scripts/debian-sources.sh), and libfabric-dev
# for the OFI bindings (src/ofi-sys, docs/libfabric.md), valgrind for the
# instruction counts of tests-c/scripts/cost-guard.sh.
TEST_DEBS   := gcc make pkg-config python3 iproute2 xz-utils libdapl-dev libdapl2 dapl2-utils \
               libibverbs-dev librdmacm-dev libclang-dev ibverbs-providers ibverbs-utils rdmacm-utils perftest \
               libfabric-dev valgrind groff-base man-db

.PHONY: all libs tools header test test-rust test-c test-ofi test-verbs deps install uninstall clean man-check

all: libs tools

tools: $(BUILD)/bin/datinfo

$(BUILD)/bin/datinfo: FORCE
	$(CARGO) build $(CARGO_FLAGS) -p udapl-tools --bin datinfo
	@mkdir -p $(BUILD)/bin
	cp $(TARGET)/datinfo $@

libs: $(LIB)/libdat2.so.2 $(LIB)/libdat2.so $(LIB)/libdat.so.1 $(LIB)/libdat.so \
      $(LIB)/libdaplrs.so.2 $(LIB)/libdaplrs-verbs.so.2 $(LIB)/libdaplrs-ofi.so.2

# Rust is built by cargo (which tracks its own dependencies); the .so is
# linked here with cc so that a version script can give every export the
# DAT_2.0 node OFED's binaries import (rustc's own linking cannot).
$(TARGET)/libdat2.a: FORCE
	$(CARGO) build $(CARGO_FLAGS) -p dat2

$(OBJ)/%.o: src/libdat2/c/%.c
	@mkdir -p $(OBJ)
	$(CC) $(CFLAGS) -fPIC -c $< -o $@

$(LIB)/libdat2.so.2: $(TARGET)/libdat2.a $(OBJ)/extension_op.o src/libdat2/libdat2.map
	@mkdir -p $(LIB)
	$(CC) -shared -o $@ -Wl,-soname,libdat2.so.2 \
		-Wl,--version-script=src/libdat2/libdat2.map -Wl,--gc-sections \
		$(OBJ)/extension_op.o \
		-Wl,--whole-archive $(TARGET)/libdat2.a -Wl,--no-whole-archive \
		-ldl -lpthread

$(LIB)/libdat2.so: $(LIB)/libdat2.so.2
	ln -sf libdat2.so.2 $@

# The DAT 1.2 registry (<dat/udat.h>, -ldat): the same registry crate as
# libdat2's, its own 1.2 API, every export in node DAT_1.2.
$(TARGET)/libdat1.a: FORCE
	$(CARGO) build $(CARGO_FLAGS) -p dat1

$(LIB)/libdat.so.1: $(TARGET)/libdat1.a src/libdat/libdat.map
	@mkdir -p $(LIB)
	$(CC) -shared -o $@ -Wl,-soname,libdat.so.1 \
		-Wl,--version-script=src/libdat/libdat.map -Wl,--gc-sections \
		-Wl,--whole-archive $(TARGET)/libdat1.a -Wl,--no-whole-archive \
		-ldl -lpthread

$(LIB)/libdat.so: $(LIB)/libdat.so.1
	ln -sf libdat.so.1 $@

# Our provider: exports dat_provider_init/fini only. dat_registry_add_provider
# stays undefined here and binds to whichever libdat2 loaded us (ours or
# OFED's), as OFED's own providers do. Built with -p, alone: a workspace-wide
# build would unify in the provider's `fuzzing` feature that dat-fuzz enables
# (docs/fuzzing.md); the shipped libraries must not have it.
$(TARGET)/libdaplrs_ffi.a: FORCE
	$(CARGO) build $(CARGO_FLAGS) -p daplrs-ffi

$(LIB)/libdaplrs.so.2: $(TARGET)/libdaplrs_ffi.a src/provider-ffi/libdaplrs.map
	@mkdir -p $(LIB)
	$(CC) -shared -o $@ -Wl,-soname,libdaplrs.so.2 \
		-Wl,--version-script=src/provider-ffi/libdaplrs.map -Wl,--gc-sections \
		-Wl,--whole-archive $(TARGET)/libdaplrs_ffi.a -Wl,--no-whole-archive \
		-ldl -lpthread

# The same provider with the ibverbs backend beside the TCP one: a library of
# its own, so libdaplrs.so.2 keeps no link to libibverbs/librdmacm and loads on
# any host; only entries naming this library need rdma-core's runtime.
$(TARGET)/libdaplrs_verbs.a: FORCE
	$(CARGO) build $(CARGO_FLAGS) -p daplrs-verbs

$(LIB)/libdaplrs-verbs.so.2: $(TARGET)/libdaplrs_verbs.a src/provider-ffi/libdaplrs.map
	@mkdir -p $(LIB)
	$(CC) -shared -o $@ -Wl,-soname,libdaplrs-verbs.so.2 \
		-Wl,--version-script=src/provider-ffi/libdaplrs.map -Wl,--gc-sections \
		-Wl,--whole-archive $(TARGET)/libdaplrs_verbs.a -Wl,--no-whole-archive \
		-libverbs -lrdmacm -ldl -lpthread

# The same provider with the libfabric backend (docs/libfabric.md), likewise
# a library of its own: only entries naming it need libfabric's runtime.
$(TARGET)/libdaplrs_ofi.a: FORCE
	$(CARGO) build $(CARGO_FLAGS) -p daplrs-ofi

$(LIB)/libdaplrs-ofi.so.2: $(TARGET)/libdaplrs_ofi.a src/provider-ofi/libdaplrs-ofi.map
	@mkdir -p $(LIB)
	$(CC) -shared -o $@ -Wl,-soname,libdaplrs-ofi.so.2 \
		-Wl,--version-script=src/provider-ofi/libdaplrs-ofi.map -Wl,--gc-sections \
		-Wl,--whole-archive $(TARGET)/libdaplrs_ofi.a -Wl,--no-whole-archive \
		-lfabric -ldl -lpthread

FORCE:

# Regenerates include/dat2/dat_types.h and dat_api.h from the Rust ABI, and
# include/dat/dat_types.h (DAT 1.2) from src/abi12.
header:
	$(CARGO) run -q -p udapl-tools --bin gen-header

# ------------------------------------------------------------------ tests

# Installs the Debian packages of $(1) that are missing (CI runs as root on
# a fresh machine).
define apt_install
	@missing=""; for p in $(1); do \
		dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "make: installing$$missing"; \
		if [ "$$(id -u)" != 0 ]; then echo "make: need root for apt-get" >&2; exit 1; fi; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq $$missing >/dev/null || exit 1; \
	fi
endef

deps:
	$(call apt_install,$(TEST_DEBS))
	@$(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy
	@$(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt

test: deps man-check reserve-ports all test-rust test-c test-packages test-verbs

# Every export of libdat2.so.2 and libdat.so.1 has a man page, the pages
# are what man/gen-pages.py makes of man/calls.in and the headers, and
# groff formats each without a warning (man/check-pages.sh; builds nothing).
man-check:
	man/check-pages.sh

# Before the Rust tests, whose plain TCP peers could otherwise leave a fixed
# port of Debian's test programs in TIME_WAIT (see tests-c/scripts/reserve-ports.sh).
reserve-ports:
	./tests-c/scripts/reserve-ports.sh
.PHONY: reserve-ports

# `cargo test --workspace` runs the DAT behaviour tests
# (src/provider/src/behaviour_tests.rs) over TCP (over_tcp::*), the same-host
# path required (over_samehost::*) and as users get it (over_samehost_lazy::*),
# and the ofi entries, and the datagram tests over the devices with datagrams
# (datagrams_over_*::*); test-verbs runs them over verbs in the guest.
test-rust:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --features daplrs/verbs -- -D warnings
	$(CARGO) run -q -p udapl-tools --bin gen-header -- --verify
	$(CARGO) test --workspace

test-c: all
	$(MAKE) -C tests-c test

# The C programs that pass over the libfabric backend's tcp entry (also a
# pass of test-c; docs/libfabric.md lists the others and why).
test-ofi: all
	$(MAKE) -C tests-c test-ofi

# The verbs layer: the RDMA-applicable tests in a soft-RoCE qemu guest
# (tests-c/scripts/verbs-guest.sh; scripts/rxe-vm installs qemu and the guest kernel
# itself; the guest's DAT/RDMA tools are in TEST_DEBS). `test` lists it
# after test-c.
test-verbs: deps all $(BUILD)/tests/daplrs-behaviour-verbs
	$(MAKE) -C tests-c test-verbs

# The provider crate's test binary built with the verbs and libfabric
# backends, for verbs-guest.sh to run the DAT behaviour tests (over_verbs::*
# and over_ofi_device::*, ignored elsewhere) in the guest on rxe0.
$(BUILD)/tests/daplrs-behaviour-verbs: FORCE
	@mkdir -p $(BUILD)/tests
	bin=$$($(CARGO) test $(CARGO_FLAGS) -p daplrs --features verbs,ofi --lib --no-run --message-format=json | \
		sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1); \
	[ -n "$$bin" ] && cp "$$bin" $@

# Threads (issue 11): `make test` runs tests-c/programs/test_threads.c in a bounded
# size; stress-threads runs bigger configurations (minutes); check-threads
# runs it under ThreadSanitizer with our Rust libraries instrumented too,
# which needs a nightly toolchain with rust-src (it says SKIPPED, loudly,
# where there is none; see tests-c/scripts/check-threads.sh).
stress-threads: all
	$(MAKE) -C tests-c stress-threads

check-threads: all
	$(MAKE) -C tests-c check-threads
.PHONY: stress-threads check-threads

# Memory (issue 11): the C tests and Debian's dtest/dapltest under
# AddressSanitizer + UBSan, valgrind memcheck of whole processes, and the
# growth runs (10,000 IA cycles, 100,000 connections, a million LMRs); see
# tests-c/scripts/check-memory.sh. Minutes; not part of `make test`, which runs
# test_cycles and test_resources at a bounded size.
MEMORY_DEBS := valgrind libasan8 libubsan1
check-memory: deps all
	$(call apt_install,$(MEMORY_DEBS))
	$(MAKE) -C tests-c check-memory
.PHONY: check-memory

# Network faults (issue 11): `make test` runs tests-c/scripts/net-faults.sh with a 2 s
# dead-peer detection time; net-faults-long at the provider's default (30 s)
# with a longer impaired run (several minutes).
net-faults-long: all
	$(MAKE) -C tests-c net-faults-long
.PHONY: net-faults-long

# ---------------------------------------------------------------- install

# `make install` (PREFIX, DESTDIR as usual): both registries (libdat2.so.2
# for DAT 2.0, libdat.so.1 for DAT 1.2), the providers, both header trees
# (include/dat2, include/dat), their pkg-config files (dat2.pc, dat.pc) and
# datinfo, and our providers registered in $(DATCONF) (the dat.conf every
# DAT registry reads by default) between two marker lines, keeping every
# line already there; scripts/datconf-merge keeps the record that lets
# `make uninstall` restore that file byte for byte. Each IA gets a u2.0 and
# a u1.2 entry of the same name (each registry serves its own version), each
# as nonthreadsafe and threadsafe (programs ask for one or the other).
# rs-tcp: on lo as rs-tcp, and as rs-tcp-<interface> on every other interface
# with an IPv4 address (so two hosts find each other with no entry written
# by hand).
# libfabric entries: one per provider and domain fi_info lists that the ofi
# backend supports and opens on here (`datinfo --ofi-entries`, from the
# backend's table in src/backend-ofi/src/catalog.rs): libfabric's tcp
# (FI_EP_MSG), as rs-ofi-tcp on lo and rs-ofi-tcp-<interface> on the others,
# tcp;ofi_rxm and shm, and where an RDMA device is, verbs and verbs;ofi_rxm.
# Entries name the provider libraries by their installed path, so they load
# whatever the loader's path. Installing to the live system (no DESTDIR)
# runs ldconfig, so that the loader finds our libdat2.so.2 and libdat.so.1
# (PREFIX's lib directory comes before the system's). The man pages of man/
# go to $(MANDIR)/man1, man3, man5 and man7 (see man/check-pages.sh).
install: all
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR)/dat2 $(DESTDIR)$(INCLUDEDIR)/dat \
		$(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(BINDIR)
	install -m 0755 $(LIB)/libdat2.so.2 $(DESTDIR)$(LIBDIR)/libdat2.so.2
	ln -sf libdat2.so.2 $(DESTDIR)$(LIBDIR)/libdat2.so
	install -m 0755 $(LIB)/libdat.so.1 $(DESTDIR)$(LIBDIR)/libdat.so.1
	ln -sf libdat.so.1 $(DESTDIR)$(LIBDIR)/libdat.so
	install -m 0755 $(LIB)/libdaplrs.so.2 $(LIB)/libdaplrs-verbs.so.2 $(LIB)/libdaplrs-ofi.so.2 $(DESTDIR)$(LIBDIR)/
	install -m 0755 $(BUILD)/bin/datinfo $(DESTDIR)$(BINDIR)/datinfo
	install -m 0644 include/dat2/*.h $(DESTDIR)$(INCLUDEDIR)/dat2/
	install -m 0644 include/dat/*.h $(DESTDIR)$(INCLUDEDIR)/dat/
	for s in 1 3 5 7; do \
		install -d $(DESTDIR)$(MANDIR)/man$$s && install -m 0644 man/man$$s/*.$$s $(DESTDIR)$(MANDIR)/man$$s/ || exit 1; \
	done
	for pc in dat2 dat; do \
		sed -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(LIBDIR)|; s|@INCLUDEDIR@|$(INCLUDEDIR)|' \
			$$pc.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/$$pc.pc || exit 1; \
	done
	@mkdir -p $(BUILD)
	@[ -z "$(DATCONF)" ] || { \
	echo '# udapl-rs over TCP on the loopback interface; for a NIC: "tcp <interface>".'; \
	echo '# Entries for DAT 2.0 programs (libdat2) and DAT 1.2 programs (libdat), each'; \
	echo '# nonthreadsafe and threadsafe (the provider is safe to call from any thread).'; \
	for api in 2.0 1.2; do for ts in nonthreadsafe threadsafe; do \
		echo "rs-tcp u$$api $$ts default $(LIBDIR)/libdaplrs.so.2 dapl.$$api \"tcp lo\" \"\""; \
	done; done; \
	for i in $$(ip -o -4 addr show 2>/dev/null | awk '$$2 != "lo" { sub(/@.*/, "", $$2); print $$2 }' | sort -u); do \
		for api in 2.0 1.2; do for ts in nonthreadsafe threadsafe; do \
			echo "rs-tcp-$$i u$$api $$ts default $(LIBDIR)/libdaplrs.so.2 dapl.$$api \"tcp $$i\" \"\""; \
		done; done; \
	done; \
	for d in $$(ls /sys/class/infiniband 2>/dev/null); do \
		for api in 2.0 1.2; do for ts in nonthreadsafe threadsafe; do \
			echo "rs-$$d u$$api $$ts default $(LIBDIR)/libdaplrs-verbs.so.2 dapl.$$api \"verbs $$d 1\" \"\""; \
		done; done; \
	done; \
	$(BUILD)/bin/datinfo --ofi-entries $(CURDIR)/$(LIB)/libdaplrs-ofi.so.2 > $(BUILD)/ofi.entries || \
		echo "make: no libfabric entries: datinfo --ofi-entries failed" >&2; \
	while IFS='	' read -r name params; do \
		for api in 2.0 1.2; do for ts in nonthreadsafe threadsafe; do \
			echo "$$name u$$api $$ts default $(LIBDIR)/libdaplrs-ofi.so.2 dapl.$$api \"$$params\" \"\""; \
		done; done; \
	done < $(BUILD)/ofi.entries; \
	} > $(BUILD)/dat.conf.entries
	$(if $(DATCONF),scripts/datconf-merge add $(DESTDIR)$(DATCONF) $(BUILD)/dat.conf.entries)
	@if [ -z "$(DESTDIR)" ]; then echo ldconfig; ldconfig; fi

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/libdat2.so.2 $(DESTDIR)$(LIBDIR)/libdat2.so
	rm -f $(DESTDIR)$(LIBDIR)/libdat.so.1 $(DESTDIR)$(LIBDIR)/libdat.so
	rm -f $(DESTDIR)$(LIBDIR)/libdaplrs.so.2 $(DESTDIR)$(LIBDIR)/libdaplrs-verbs.so.2 $(DESTDIR)$(LIBDIR)/libdaplrs-ofi.so.2
	rm -f $(DESTDIR)$(BINDIR)/datinfo
	rm -f $(addprefix $(DESTDIR)$(INCLUDEDIR)/dat2/,$(notdir $(wildcard include/dat2/*.h)))
	-rmdir $(DESTDIR)$(INCLUDEDIR)/dat2 2>/dev/null
	rm -f $(addprefix $(DESTDIR)$(INCLUDEDIR)/dat/,$(notdir $(wildcard include/dat/*.h)))
	-rmdir $(DESTDIR)$(INCLUDEDIR)/dat 2>/dev/null
	rm -f $(DESTDIR)$(LIBDIR)/pkgconfig/dat2.pc $(DESTDIR)$(LIBDIR)/pkgconfig/dat.pc
	rm -f $(foreach s,1 3 5 7,$(addprefix $(DESTDIR)$(MANDIR)/man$(s)/,$(notdir $(wildcard man/man$(s)/*.$(s)))))
	$(if $(DATCONF),scripts/datconf-merge remove $(DESTDIR)$(DATCONF))
	@if [ -z "$(DESTDIR)" ]; then echo ldconfig; ldconfig; fi

clean:
	rm -rf $(BUILD)
	$(CARGO) clean

# -------------------------------------------------------------------- deb
# Debian packages (issue 42; debian/README.source says which and why):
# dpkg-buildpackage builds debian/ in a copy of the tree ($(BUILD)/deb-src,
# so that this tree's build/ and target/ stay the developer's; cargo keeps a
# target directory of its own, $(BUILD)/deb-target), the .debs go to
# $(BUILD)/deb, and lintian fails the target on an error (warnings are
# printed). The crates are fetched first: the package build runs cargo
# offline; this make's variables do not reach it (debian/rules sets its
# own: PREFIX=/usr, the multiarch LIBDIR, DATCONF=). tests-c/scripts/deb-check.sh installs the packages in a bookworm chroot.
DEB_TARGET_DIR ?= $(CURDIR)/$(BUILD)/deb-target
DEB_DEBS := dpkg-dev debhelper lintian gcc pkgconf libclang-dev libfabric-dev libibverbs-dev librdmacm-dev
deb:
	$(call apt_install,$(DEB_DEBS))
	$(CARGO) fetch --locked
	rm -rf $(BUILD)/deb $(BUILD)/deb-src
	mkdir -p $(BUILD)/deb $(BUILD)/deb-src/udapl-rs
	tar -cf - --exclude=./.git --exclude=./target --exclude=./$(BUILD) . | tar -xf - -C $(BUILD)/deb-src/udapl-rs
	cd $(BUILD)/deb-src/udapl-rs && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
		CARGO_TARGET_DIR=$(DEB_TARGET_DIR) dpkg-buildpackage -b -us -uc
	mv $(BUILD)/deb-src/*.deb $(BUILD)/deb-src/*.buildinfo $(BUILD)/deb-src/*.changes $(BUILD)/deb/
	rm -rf $(BUILD)/deb-src
	lintian --fail-on error $(BUILD)/deb/*.changes
.PHONY: deb

# -------------------------------------------------------------------- rpm
# RPM packages (issue 42; redhat/udapl-rs.spec says which and why): the
# split and the dat.conf registration of the Debian packages. rpmbuild
# (Debian's rpm package has it) builds the spec from a tarball of the tree
# (without .git, target/ and build/) under $(BUILD)/rpm-top, cargo keeps a
# target directory of its own ($(BUILD)/rpm-target) and runs offline after
# `cargo fetch`, and the .rpms go to $(BUILD)/rpm. As for deb, this make's
# variables do not reach the build (the spec sets PREFIX=/usr,
# LIBDIR=%{_libdir}, DATCONF=). On Debian (dpkg present) the rpm tooling
# is installed with apt-get, and rpmbuild runs with --nodeps: its database
# knows none of the BuildRequires, which Debian's packages provide. No
# debuginfo packages: Debian's rpm has no find-debuginfo (debug_package is
# %{nil}; brp-strip still strips, as Debian's packages are). brp-compress
# (the man pages' gzip) runs under bash: it needs bash (read -d '') but
# says #!/bin/sh, which is dash on Debian, where it would compress nothing.
# `make rpm-check` (tests-c/scripts/rpm-check.sh) inspects the packages and
# installs them in a throw-away root.
RPM_DEBS    := rpm gcc pkgconf libclang-dev libfabric-dev libibverbs-dev librdmacm-dev
RPM_SPEC    := redhat/udapl-rs.spec
RPM_TARGET_DIR ?= $(CURDIR)/$(BUILD)/rpm-target
RPM_VERSION  = $(shell sed -n 's/^Version: *//p' $(RPM_SPEC))
rpm:
	$(if $(shell command -v dpkg 2>/dev/null),$(call apt_install,$(RPM_DEBS)))
	$(CARGO) fetch --locked
	rm -rf $(BUILD)/rpm $(BUILD)/rpm-top
	mkdir -p $(BUILD)/rpm $(BUILD)/rpm-top/SOURCES
	tar -czf $(BUILD)/rpm-top/SOURCES/udapl-rs-$(RPM_VERSION).tar.gz \
		--exclude=./.git --exclude=./target --exclude=./$(BUILD) \
		--transform 's,^\.,udapl-rs-$(RPM_VERSION),' .
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
		CARGO_TARGET_DIR=$(RPM_TARGET_DIR) CARGO_NET_OFFLINE=true \
		rpmbuild -bb $(if $(shell command -v dpkg 2>/dev/null),--nodeps) \
		--define '_topdir $(CURDIR)/$(BUILD)/rpm-top' \
		--define 'debug_package %{nil}' \
		--define '__brp_compress bash %{_rpmconfigdir}/brp-compress %{?_prefix}' $(RPM_SPEC)
	mv $(BUILD)/rpm-top/RPMS/*/*.rpm $(BUILD)/rpm/
	@ls -l $(BUILD)/rpm

rpm-check: rpm
	tests-c/scripts/rpm-check.sh $(BUILD)/rpm
.PHONY: rpm rpm-check

# The packages as a site installs them, in `make test` (issue 42, item 4):
# the Debian and RPM packages of the libraries `all` built and the tests
# ran (CARGO=true in the environment reaches debian/rules' and the spec's
# make: cargo's work is done, target/release holds it; the package builds
# compile the C parts, link, lay out and check their packages as make deb
# and make rpm do), then deb-check.sh and rpm-check.sh install them in
# throw-away bookworm roots (the first run downloads bookworm once, into
# build/deb-check/bookworm.tgz) and run Debian's dapltest and dtest
# through them. `make deb` and `make rpm` alone build from source.
test-packages: all
	CARGO=true $(MAKE) --no-print-directory deb DEB_TARGET_DIR=$(CURDIR)/target
	CARGO=true $(MAKE) --no-print-directory rpm RPM_TARGET_DIR=$(CURDIR)/target
	tests-c/scripts/deb-check.sh $(BUILD)/deb; deb=$$?; \
	tests-c/scripts/rpm-check.sh $(BUILD)/rpm; rpm=$$?; \
	[ $$deb = 0 ] && [ $$rpm = 0 ]
.PHONY: test-packages

# ------------------------------------------------------- bench and demo
# Not part of `make test`: benchmarks print figures, they assert nothing.
# qperf (tcp_bw), dapltest and iproute2 (the veth setting) are installed here.
BENCH_DEBS := qperf dapl2-utils iproute2
bench: all
	$(call apt_install,$(BENCH_DEBS))
	$(MAKE) -C bench bench

demo: all
	$(MAKE) -C bench demo
.PHONY: bench demo

# ------------------------------------------------------------------- fuzz
# Every parser that reads outside input (dat.conf, ia_params, the wire
# protocol, the engine from both ends; the harnesses in src/fuzz, fuzz/ wraps
# them for libFuzzer; docs/fuzzing.md). `make test` runs a
# bounded pass of each target (cargo test -p dat-fuzz, a few seconds each).
# `make fuzz` is the long run: coverage-guided with libFuzzer when a nightly
# toolchain and cargo-fuzz are installed (new inputs go to build/fuzz/corpus,
# crashes to fuzz/regressions/<target>/), else the stable in-house fuzzer
# (datfuzz). FUZZ_SECONDS is the time per target.
FUZZ_SECONDS ?= 75
FUZZ_TARGETS ?= conf ia_params wire_header wire_stream wire_roundtrip ud_datagram engine_target engine_initiator engine_datagram
fuzz:
	@if rustup toolchain list 2>/dev/null | grep -q '^nightly' && $(CARGO) fuzz --version >/dev/null 2>&1; then \
		echo "fuzz: libFuzzer (cargo +nightly fuzz), $(FUZZ_SECONDS)s a target"; \
		for t in $(FUZZ_TARGETS); do \
			mkdir -p $(BUILD)/fuzz/corpus/$$t fuzz/regressions/$$t || exit 1; \
			ml=8192; [ $$t = engine_initiator ] && ml=73728; \
			$(CARGO) +nightly fuzz run -O $$t $(BUILD)/fuzz/corpus/$$t fuzz/corpus/$$t fuzz/regressions/$$t -- \
				-max_total_time=$(FUZZ_SECONDS) -max_len=$$ml -artifact_prefix=fuzz/regressions/$$t/ \
				-print_final_stats=1 >$(BUILD)/fuzz/$$t.log 2>&1; rc=$$?; \
			echo "$$t: $$(grep -E '^stat::number_of_executed_units' $(BUILD)/fuzz/$$t.log)"; \
			if [ $$rc -ne 0 ]; then tail -40 $(BUILD)/fuzz/$$t.log; exit 1; fi; \
		done; \
	else \
		echo "fuzz: no nightly toolchain with cargo-fuzz: the stable in-house fuzzer, $(FUZZ_SECONDS)s a target"; \
		$(CARGO) run --release -q -p dat-fuzz --bin datfuzz -- --seconds $(FUZZ_SECONDS) $(FUZZ_TARGETS); \
	fi
.PHONY: fuzz
