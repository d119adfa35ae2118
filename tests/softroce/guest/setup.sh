#!/bin/bash
# Runs inside the VM as root, chrooted into the host's root (read-only 9p).
# Brings up the Soft-RoCE devices with the host's own iproute2, exports where
# they are, then runs the command in /run/vrpc/cmd and exits with its status.
#   single: dummy netdev vrs0 10.99.0.1/24 with rxe device vrpc_rxe0; client
#           and server share it (rxe's internal loopback path)
#   veth:   veth pair vra/vrb 10.99.1.1 and 10.99.1.2, rxe devices vrpc_rxe_a
#           and vrpc_rxe_b; policy routing makes traffic between the two
#           addresses cross the veth (two "hosts" in one namespace: rxe on
#           kernel 6.1 does not work across network namespaces)
# Exported: VRPC_VERBS_{IP,DEV,GID} (single) and VRPC_VERBS_{IP,DEV,GID}_{A,B}
# (veth). GID is the index of the RoCE v2 GID that maps the IPv4 address; the
# backend does not need it (rdma_cm picks the GID from the address), perftest does.
set -u
CTL=/run/vrpc
. "$CTL/config"
T() { local u; read -r u _ < /proc/uptime; echo "guest_$1 $u" >> "$CTL/timings"; }
fail() { echo "softroce setup: $*" >&2; echo "$*" > "$CTL/setup-error"; exit 120; }
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 TERM=dumb
echo vrpc-softroce > /proc/sys/kernel/hostname

# IPv4 -> RoCE v2 GID index, waiting for ib_core's GID table to fill.
# Bash builtins only: every fork+exec costs milliseconds under TCG.
gid_index() {
    local d=/sys/class/infiniband/$1/ports/1 want g i v t n
    printf -v want '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' ${2//./ }
    for ((n = 0; n < 200; n++)); do
        for g in "$d"/gids/*; do
            i=${g##*/}; v= t=
            read -r v < "$g" 2>/dev/null
            [[ $v == "$want" ]] || continue
            read -r t < "$d/gid_attrs/types/$i" 2>/dev/null
            [[ $t == "RoCE v2" ]] && { echo "$i"; return 0; }
        done
        sleep 0.05
    done
    return 1
}
sysctl_w() { echo "$2" > "/proc/sys/${1//.//}"; }

IPB="link set lo up"$'\n' RDMAB=
if [[ $VRPC_NET == single || $VRPC_NET == both ]]; then
    IPB+="link add vrs0 type dummy
addr add 10.99.0.1/24 dev vrs0
link set vrs0 up
"
    RDMAB+="link add vrpc_rxe0 type rxe netdev vrs0"$'\n'
fi
if [[ $VRPC_NET == veth || $VRPC_NET == both ]]; then
    for k in all default; do
        sysctl_w net.ipv4.conf.$k.rp_filter 0; sysctl_w net.ipv4.conf.$k.accept_local 1
    done
    # Without this, traffic between two local addresses takes lo, and rxe drops
    # packets arriving on a netdev without an rxe device. Local output to the
    # peer's address leaves through our own veth end; the local table moves
    # behind those rules; accept_local lets the packet in on the other end.
    IPB+="link add vra type veth peer name vrb
addr add 10.99.1.1/24 dev vra
addr add 10.99.1.2/24 dev vrb
link set vra up
link set vrb up
rule add pref 100 iif lo to 10.99.1.2 lookup 100
route add 10.99.1.2 dev vra src 10.99.1.1 table 100
rule add pref 100 iif lo to 10.99.1.1 lookup 101
route add 10.99.1.1 dev vrb src 10.99.1.2 table 101
rule add pref 1000 lookup local
rule del pref 0 lookup local
"
    RDMAB+="link add vrpc_rxe_a type rxe netdev vra
link add vrpc_rxe_b type rxe netdev vrb
"
fi
ip -b - <<<"$IPB" || fail "ip -batch failed"
if [[ $VRPC_NET == veth || $VRPC_NET == both ]]; then
    for d in vra vrb; do sysctl_w net.ipv4.conf.$d.rp_filter 0; sysctl_w net.ipv4.conf.$d.accept_local 1; done
fi
rdma -b - <<<"$RDMAB" || fail "rdma link add failed"
if [[ $VRPC_NET == single || $VRPC_NET == both ]]; then
    export VRPC_VERBS_DEV=vrpc_rxe0 VRPC_VERBS_IP=10.99.0.1
    VRPC_VERBS_GID=$(gid_index vrpc_rxe0 10.99.0.1) || fail "no RoCE v2 GID on vrpc_rxe0"
    export VRPC_VERBS_GID
fi
if [[ $VRPC_NET == veth || $VRPC_NET == both ]]; then
    export VRPC_VERBS_DEV_A=vrpc_rxe_a VRPC_VERBS_IP_A=10.99.1.1
    export VRPC_VERBS_DEV_B=vrpc_rxe_b VRPC_VERBS_IP_B=10.99.1.2
    VRPC_VERBS_GID_A=$(gid_index vrpc_rxe_a 10.99.1.1) || fail "no RoCE v2 GID on vrpc_rxe_a"
    VRPC_VERBS_GID_B=$(gid_index vrpc_rxe_b 10.99.1.2) || fail "no RoCE v2 GID on vrpc_rxe_b"
    export VRPC_VERBS_GID_A VRPC_VERBS_GID_B
fi
T rxe_ready
# rdma_rxe 6.1 works in tasklets. While a busy-polling thread owns a vCPU the
# softirq work is pushed to ksoftirqd, which then waits for the next tick
# (4 ms at HZ=250): latencies turn bimodal. SCHED_FIFO ksoftirqd avoids it.
if [[ ${VRPC_RT_SOFTIRQ:-1} == 1 ]]; then
    for c in /proc/[0-9]*/comm; do
        read -r n < "$c" 2>/dev/null || continue
        [[ $n == ksoftirqd/* ]] || continue
        p=${c#/proc/}; chrt -f -p 1 "${p%/comm}" >/dev/null || echo "softroce setup: chrt ${p%/comm} failed" >&2
    done
fi
cd "$VRPC_CWD" 2>/dev/null || cd /
T cmd_start
: > "$CTL/started"
# the command was written with printf %q on the host
( eval "$(< "$CTL/cmd")" ) </dev/null
rc=$?
T cmd_end
exit $rc
