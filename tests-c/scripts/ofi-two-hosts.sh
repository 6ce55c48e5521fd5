#!/usr/bin/env bash
# two-hosts.sh over the libfabric entry rs-ofi-tcp: two network namespaces
# joined by a veth pair, a dapltest server in one, the transaction tests from
# the other, each side's IA on its own veth address ("ofi tcp veth...").
# With DAT_TEST_IA=rs-ofi-rxm: the same over tcp;ofi_rxm (FI_EP_RDM, our
# connection layer).
backend=ofi
[ "${DAT_TEST_IA:-}" = rs-ofi-rxm ] && backend=ofi-rxm
exec env TWO_HOSTS_BACKEND=$backend "$(dirname "$0")/two-hosts.sh"
