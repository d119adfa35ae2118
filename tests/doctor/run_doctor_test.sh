#!/bin/bash
# verbrpc-doctor's report checked against what the host really has.
#   run_doctor_test.sh DOCTOR norDMA   a host without RDMA: says so, exit 1
#                                      (skips, 77, where a device exists)
#   run_doctor_test.sh DOCTOR vm [ECHO_SERVER [ECHO_CLIENT]]   the Soft-RoCE VM (tests/softroce): every
#       device and RoCE v2 GID the VM set up (VRPC_VERBS_DEV*, VRPC_VERBS_GID*,
#       VRPC_VERBS_IP*) is reported on its netdev, all is fine (exit 0), the
#       route to the veth peer goes out of the right device, and a lowered
#       memlock limit (ulimit -l 64, without CAP_IPC_LOCK) is reported with
#       its fix (exit 1), and an address on a netdev without RDMA. With
#       ECHO_SERVER and ECHO_CLIENT the verbs backend's own errors for the
#       last two (a server on that address, a client under ulimit -l 64) are
#       checked to be the same sentences. Skips (77) outside the VM.
set -uo pipefail
DOC=$1 MODE=$2
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
run() { out=$("$DOC" "$@" 2>&1); rc=$?; printf '%s\n' "$out"; }
has() { grep -qF -- "$1" <<<"$out" || fail "no '$1' in the output"; }

# usage errors and --help, everywhere
"$DOC" --bogus >/dev/null 2>&1; [[ $? == 2 ]] || fail "--bogus: exit not 2"
"$DOC" --peer not-an-ip >/dev/null 2>&1; [[ $? == 2 ]] || fail "--peer not-an-ip: exit not 2"
"$DOC" --help | grep -q '^usage: ' || fail "--help prints no usage"

case $MODE in
nordma)
    if compgen -G '/sys/class/infiniband/*' >/dev/null; then echo "this host has RDMA devices: skip"; exit 77; fi
    run
    [[ $rc == 1 ]] || fail "exit $rc, want 1 (problems found)"
    grep -qE 'this kernel has no RDMA support|no RDMA device' <<<"$out" || fail "does not say there is no RDMA"
    has "problem(s):"
    ;;
vm)
    [[ -n ${VRPC_VERBS_DEV:-} && -n ${VRPC_VERBS_DEV_A:-} ]] || { echo "not in the Soft-RoCE VM: skip"; exit 77; }
    ulimit -l unlimited 2>/dev/null || true
    run
    [[ $rc == 0 ]] || fail "exit $rc on the VM's good set-up, want 0"
    has "no problems found"
    # each device with its RoCE v2 GID for its address, on the netdev setup.sh gave it
    for s in "" _A _B; do
        dev=VRPC_VERBS_DEV$s gid=VRPC_VERBS_GID$s ip=VRPC_VERBS_IP$s
        nd=$(ip -o addr show to "${!ip}" | awk '{print $2; exit}')
        has "  ${!dev}: "
        has "${!dev} port 1 GID ${!gid}: RoCE v2, netdev $nd, address ${!ip}"
        grep -qE "^  port 1: ACTIVE, link layer Ethernet, active MTU [0-9]+ .*netdev $nd" <<<"$out" ||
            fail "no active Ethernet port on $nd"
    done
    # the veth peer: out of device A, from A's address, on A's RoCE v2 GID
    run --peer "$VRPC_VERBS_IP_B"
    [[ $rc == 0 ]] || fail "--peer $VRPC_VERBS_IP_B: exit $rc, want 0"
    has "peer: route resolved: from $VRPC_VERBS_IP_A, device $VRPC_VERBS_DEV_A port 1"
    has "peer: source GID $VRPC_VERBS_GID_A (RoCE v2, $VRPC_VERBS_DEV_A, netdev vra, address $VRPC_VERBS_IP_A)"
    has "peer: path MTU "
    # an address on no RDMA netdev
    run --peer 192.0.2.1
    [[ $rc == 1 ]] || fail "--peer 192.0.2.1 (no route): exit $rc, want 1"
    has "rdma_cm finds no RDMA route to 192.0.2.1"
    # a lowered memlock limit, for a process without CAP_IPC_LOCK (root has
    # it, and the kernel does not apply the limit then)
    nocap=(setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock --)
    out=$(ulimit -l 64 && "${nocap[@]}" "$DOC" 2>&1); rc=$?
    printf '%s\n' "$out"
    [[ $rc == 1 ]] || fail "ulimit -l 64: exit $rc, want 1"
    has "memlock: limit 64 KiB"
    has "the locked-memory limit (ulimit -l) is 64 KiB"
    has "ulimit -l unlimited"
    out=$(ulimit -l 64 && "$DOC" 2>&1); rc=$?
    printf '%s\n' "$out"
    [[ $rc == 0 ]] || fail "ulimit -l 64 with CAP_IPC_LOCK: exit $rc, want 0"
    has "not enforced for this process (it has CAP_IPC_LOCK)"
    # an address on a netdev without an RDMA device
    ip link add vrpc_doc0 type dummy && ip addr add 10.98.0.1/24 dev vrpc_doc0 && ip link set vrpc_doc0 up ||
        fail "cannot add a dummy netdev"
    run --peer 10.98.0.2
    [[ $rc == 1 ]] || fail "--peer 10.98.0.2 (netdev without RDMA): exit $rc, want 1"
    has "no RoCE v2 GID holds"
    # the verbs backend says the same as the doctor
    if [[ -n ${3:-} ]]; then
        SRV=$3
        out=$(timeout 20 "$SRV" --listen verbs://10.98.0.1:0 2>&1); rc=$?
        printf '$ echo_server --listen verbs://10.98.0.1:0\n%s\n' "$out"
        [[ $rc != 0 && $rc != 124 ]] || fail "echo_server on a non-RDMA address: exit $rc"
        has "no RoCE v2 GID holds 10.98.0.1: the address is not on an RDMA device's netdev"
    fi
    if [[ -n ${4:-} ]]; then
        # a client whose pools cannot be registered (a transport registers
        # when it binds to its device: at the client's connect)
        CLI=$4 tmp=$(mktemp -d)
        "$SRV" --listen verbs://"$VRPC_VERBS_IP":0 --uri-file "$tmp/uri" >"$tmp/server.log" 2>&1 &
        spid=$!
        for _ in $(seq 200); do [[ -s $tmp/uri ]] && break; sleep 0.1; done
        [[ -s $tmp/uri ]] || fail "echo_server did not start: $(cat "$tmp/server.log")"
        out=$(ulimit -l 64 && timeout 30 "${nocap[@]}" "$CLI" --connect "$(cat "$tmp/uri")" hi 2>&1); rc=$?
        printf '$ ulimit -l 64; echo_client --connect %s hi\n%s\n' "$(cat "$tmp/uri")" "$out"
        [[ $rc != 0 && $rc != 124 ]] || fail "echo_client with ulimit -l 64: exit $rc"
        has "the locked-memory limit (ulimit -l) is 64 KiB, below what verbrpc registers"
        kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null; rm -rf "$tmp"
    fi
    ip link del vrpc_doc0 2>/dev/null
    ;;
*) echo "usage: $0 DOCTOR nordma|vm" >&2; exit 2 ;;
esac
((fails == 0)) && echo "doctor: all checks passed" && exit 0
exit 1
