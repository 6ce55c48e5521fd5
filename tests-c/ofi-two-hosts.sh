#!/usr/bin/env bash
# two-hosts.sh over the libfabric entry rs-ofi-tcp: two network namespaces
# joined by a veth pair, a dapltest server in one, the transaction tests from
# the other, each side's IA on its own veth address ("ofi tcp veth...").
exec env TWO_HOSTS_BACKEND=ofi "$(dirname "$0")/two-hosts.sh"
