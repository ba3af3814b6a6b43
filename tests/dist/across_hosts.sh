#!/usr/bin/env bash
# Ring attention across two "hosts": two network namespaces joined by a veth pair
# (ip netns, iproute2), shared-memory transport off (--mca btl tcp,self), the remote rank
# started by Open MPI's rsh launcher through an agent that runs `ip netns exec <host>`.
# Needs root (CAP_NET_ADMIN) and iproute2; creates the namespaces (named after this
# process, so that concurrent runs do not collide) and removes them on exit. Exit 77
# (ctest's skip) where namespaces cannot be made.
#
#   tests/dist/across_hosts.sh PROGRAM [ARGS...]      e.g. build/release/tests/dist/ring_test
set -euo pipefail
program=("$@")
[[ ${#program[@]} -gt 0 ]] || { echo "usage: $0 PROGRAM [ARGS...]" >&2; exit 2; }
a=sdpa_a_$$ b=sdpa_b_$$ veth_a=vsa$$ veth_b=vsb$$ ip_a=10.77.0.1 ip_b=10.77.0.2
work=$(mktemp -d)
cleanup() { ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

command -v ip > /dev/null && ip netns add "$a" 2> "$work/why" || { echo "across_hosts: skipped: $(cat "$work/why")"; exit 77; }
ip netns add "$b"
ip link add "$veth_a" type veth peer name "$veth_b"
ip link set "$veth_a" netns "$a"
ip link set "$veth_b" netns "$b"
ip -n "$a" addr add "$ip_a/24" dev "$veth_a"
ip -n "$b" addr add "$ip_b/24" dev "$veth_b"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "$veth_a" up
ip -n "$b" link set "$veth_b" up
ip -n "$a" route get "$ip_b" > /dev/null  # the pair is up (no ping on a slim Debian)

# The launcher's remote shell: "<agent> <host> <command...>" runs the command in the
# namespace that holds the host's address.
cat > "$work/netns_rsh" <<AGENT
#!/bin/sh
host=\$1; shift
case "\$host" in $ip_a) ns=$a ;; $ip_b) ns=$b ;; *) echo "netns_rsh: unknown host \$host" >&2; exit 1 ;; esac
exec ip netns exec "\$ns" sh -c "\$*"
AGENT
chmod +x "$work/netns_rsh"
printf '%s slots=1\n%s slots=1\n' "$ip_a" "$ip_b" > "$work/hosts"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# The sanitizer build's ASAN_OPTIONS (tests/dist/CMakeLists.txt) reach the remote ranks too.
forward=(-x OMP_NUM_THREADS)
[[ -n ${ASAN_OPTIONS:-} ]] && forward+=(-x ASAN_OPTIONS)
timeout 300 ip netns exec "$a" mpirun -np 2 --hostfile "$work/hosts" \
  --mca plm_rsh_agent "$work/netns_rsh" --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 \
  --mca oob_tcp_if_include 10.77.0.0/24 "${forward[@]}" "${program[@]}"
