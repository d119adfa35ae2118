#!/bin/bash
# vm.sh - runs one command inside a throw-away qemu VM whose Debian kernel has
# Soft-RoCE (rdma_rxe) up, and exits with the command's status. The VM sees
# this machine's root filesystem read-only, so the command uses the host's
# binaries, libraries and build output; run it from (or --share) a directory
# it must write to.
#
#   tests/softroce/vm.sh [options] -- COMMAND [ARGS...]
#   e.g. tests/softroce/vm.sh -- ibv_devinfo
#        tests/softroce/vm.sh --share build -- ctest --test-dir build -L verbs
#
# Inside: root, `ulimit -l unlimited`, the same working directory, stdin
# /dev/null, fresh tmpfs on /tmp /run /var/tmp /root; the command's stdout and
# stderr are streamed back separately. Soft-RoCE (see guest/setup.sh):
#   VRPC_VERBS_IP=10.99.0.1  VRPC_VERBS_DEV=vrpc_rxe0  VRPC_VERBS_GID      (single)
#   VRPC_VERBS_IP_A=10.99.1.1 VRPC_VERBS_DEV_A=vrpc_rxe_a VRPC_VERBS_GID_A (veth end a)
#   VRPC_VERBS_IP_B=10.99.1.2 VRPC_VERBS_DEV_B=vrpc_rxe_b VRPC_VERBS_GID_B (veth end b)
# No packet leaves the VM (qemu -nic none).
#
# Options:
#   --net single|veth|both  Soft-RoCE set-up (default both)
#   --share DIR             mount DIR read-write (repeatable)
#   --no-share-cwd          do not mount the working directory read-write
#   --env NAME=VALUE        set an environment variable for the command (repeatable)
#   --timeout SEC           kill the VM after SEC seconds, exit 124 (default 0 = none)
#   --boot-timeout SEC      give up when the command has not started (default 120), exit 125
#   --smp N --mem MB        guest CPUs (default: host CPUs, at most 4) and memory (2048)
#   --accel auto|kvm|tcg    auto = kvm when the CPU has vmx/svm, else tcg
#   --no-rt-softirq         keep ksoftirqd at normal priority
#   --keep                  keep the run folder (console.log, dmesg.txt, timings)
#   --timing-file FILE      append "name seconds" lines (boot, command, total) to FILE
#   -v                      print timings
# Exit: the command's status; 120 Soft-RoCE set-up failed; 124 timeout;
# 125 the VM did not boot or died; 2 bad usage. The first run builds the cache
# (tests/softroce/prepare.sh: kernel via apt-get download, about 10 s).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

NET=both ACCEL=${VRPC_SOFTROCE_ACCEL:-auto} SMP= MEM=2048 TIMEOUT=0 BOOT_TIMEOUT=120
SHARE_CWD=1 KEEP=0 VERBOSE=0 TIMING_FILE= RT_SOFTIRQ=1 SHARES=() ENVS=()
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
while (($#)); do
    case $1 in
        --net) NET=$2; shift 2 ;;
        --share) SHARES+=("$(cd "$2" && pwd)") || exit 2; shift 2 ;;
        --no-share-cwd) SHARE_CWD=0; shift ;;
        --env) [[ $2 == [A-Za-z_]*=* ]] || { echo "vm.sh: --env wants NAME=VALUE" >&2; exit 2; }
               ENVS+=("$2"); shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        --boot-timeout) BOOT_TIMEOUT=$2; shift 2 ;;
        --smp) SMP=$2; shift 2 ;;
        --mem) MEM=$2; shift 2 ;;
        --accel) ACCEL=$2; shift 2 ;;
        --no-rt-softirq) RT_SOFTIRQ=0; shift ;;
        --keep) KEEP=1; shift ;;
        --timing-file) TIMING_FILE=$2; shift 2 ;;
        -v) VERBOSE=1; shift ;;
        -h|--help) usage ;;
        --) shift; break ;;
        *) echo "vm.sh: unknown option $1 (the command goes after --)" >&2; exit 2 ;;
    esac
done
(($#)) || usage
case $NET in single|veth|both) ;; *) echo "vm.sh: --net must be single, veth or both" >&2; exit 2 ;; esac

now_ms() { local t; t=$(date +%s%N); echo $((t / 1000000)); }
secs() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }   # ms -> "s.mmm"
T0=$(now_ms)
PREP=$("$HERE/prepare.sh") || { echo "vm.sh: cannot prepare the VM (see above)" >&2; exit 125; }
eval "$PREP"   # KVER KERNEL INITRD
T_PREP=$(now_ms)

if [[ $ACCEL == auto ]]; then
    ACCEL=tcg
    [[ -w /dev/kvm ]] && grep -qw -e vmx -e svm /proc/cpuinfo && ACCEL=kvm
fi
case $ACCEL in
    kvm) ACCEL_ARGS=(-accel kvm -cpu host) ;;
    tcg) ACCEL_ARGS=(-accel tcg,thread=multi,tb-size=256 -cpu max) ;;
    *) echo "vm.sh: --accel must be auto, kvm or tcg" >&2; exit 2 ;;
esac
if [[ -z $SMP ]]; then SMP=$(nproc); ((SMP > 4)) && SMP=4; fi

# ---- the run folder: the VM's control share ----------------------------------
R=$(mktemp -d "${TMPDIR:-/tmp}/vrpc-vm.XXXXXX")
QPID= OUTPID= ERRPID=
cleanup() {
    [[ -n $QPID ]] && kill "$QPID" 2>/dev/null
    [[ -n $OUTPID ]] && kill "$OUTPID" "$ERRPID" 2>/dev/null
    if ((KEEP)); then echo "vm.sh: run folder kept: $R" >&2; else rm -rf "$R"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

CWD=$(pwd)
((SHARE_CWD)) && [[ $CWD != / ]] && SHARES=("$CWD" "${SHARES[@]}")
# The repository itself is always shared (first, so shares inside it, such as
# a build directory, mount on top): the guest's /tmp, /run, /var/tmp and /root
# are fresh tmpfs, so a clone under one of them (as CI may make) would
# otherwise be invisible, guest/setup.sh included.
REPO=$(cd "$HERE/../.." && pwd)
SHARES=("$REPO" "${SHARES[@]}")
VIRTFS=(-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
        -virtfs "local,path=$R,mount_tag=vrpc_ctl,security_model=none")
SHARESPEC= i=0
for d in "${SHARES[@]}"; do
    VIRTFS+=(-virtfs "local,path=$d,mount_tag=share$i,security_model=none,multidevs=remap")
    SHARESPEC+="share$i=$d "
    i=$((i + 1))
done
{
    echo "VRPC_NET=$NET"
    echo "VRPC_RT_SOFTIRQ=$RT_SOFTIRQ"
    printf 'VRPC_CWD=%q\n' "$CWD"
    printf 'VRPC_SETUP=%q\n' "$HERE/guest/setup.sh"
    printf 'SHARES=%q\n' "$SHARESPEC"
    for e in "${ENVS[@]}"; do printf 'export %s=%q\n' "${e%%=*}" "${e#*=}"; done
} > "$R/config"
printf '%q ' "$@" > "$R/cmd"

# ---- boot ----------------------------------------------------------------------
APPEND="console=ttyS0 quiet loglevel=1 panic=-1 oops=panic mitigations=off nokaslr tsc=reliable no_timer_check random.trust_cpu=on"
mkfifo "$R/out.fifo" "$R/err.fifo"
cat "$R/out.fifo" & OUTPID=$!
cat "$R/err.fifo" >&2 & ERRPID=$!
T_LAUNCH=$(now_ms)
qemu-system-x86_64 "${ACCEL_ARGS[@]}" -m "$MEM" -smp "$SMP" \
    -nodefaults -no-user-config -display none -no-reboot -nic none \
    -kernel "$KERNEL" -initrd "$INITRD" -append "$APPEND" \
    -serial "file:$R/console.log" \
    -chardev "file,id=out,path=$R/out.fifo" -serial chardev:out \
    -chardev "file,id=err,path=$R/err.fifo" -serial chardev:err \
    "${VIRTFS[@]}" </dev/null >"$R/qemu.log" 2>&1 &
QPID=$!

status= T_START=
boot_deadline=$((T_LAUNCH + BOOT_TIMEOUT * 1000))
all_deadline=0; ((TIMEOUT > 0)) && all_deadline=$((T_LAUNCH + TIMEOUT * 1000))
while kill -0 "$QPID" 2>/dev/null; do
    t=$(now_ms)
    [[ -z $T_START && -e $R/started ]] && T_START=$t
    if [[ -z $T_START ]] && ((t > boot_deadline)); then
        echo "vm.sh: the command did not start within ${BOOT_TIMEOUT}s ($ACCEL); killing the VM" >&2
        [[ -f $R/init-error ]] && echo "vm.sh: init: $(<"$R/init-error")" >&2
        tail -n 20 "$R/console.log" 2>/dev/null | sed 's/^/vm.sh: console: /' >&2
        status=125; kill "$QPID"; break
    fi
    if ((all_deadline > 0 && t > all_deadline)); then
        echo "vm.sh: timeout (${TIMEOUT}s) reached; killing the VM" >&2
        status=124; kill "$QPID"; break
    fi
    sleep 0.05
done
wait "$QPID"; qrc=$?
QPID=
wait "$OUTPID" "$ERRPID" 2>/dev/null    # qemu closed the fifos: all output relayed
OUTPID=
T_END=$(now_ms)

if [[ -z $status ]]; then
    if [[ -f $R/rc ]]; then
        status=$(<"$R/rc")
    else
        status=125
        echo "vm.sh: the VM stopped without a result (qemu exit $qrc)" >&2
        [[ -s $R/qemu.log ]] && sed 's/^/vm.sh: qemu: /' "$R/qemu.log" >&2
        [[ -f $R/init-error ]] && echo "vm.sh: init: $(<"$R/init-error")" >&2
        tail -n 20 "$R/console.log" 2>/dev/null | sed 's/^/vm.sh: console: /' >&2
    fi
fi
[[ -f $R/setup-error ]] && echo "vm.sh: Soft-RoCE set-up failed: $(<"$R/setup-error")" >&2

{
    echo "prepare $(secs $((T_PREP - T0)))"
    [[ -n $T_START ]] && echo "boot $(secs $((T_START - T_LAUNCH)))"
    [[ -n $T_START ]] && echo "command $(secs $((T_END - T_START)))"
    echo "vm_total $(secs $((T_END - T_LAUNCH)))"
    echo "total $(secs $((T_END - T0)))"
} > "$R/host_timings"
((VERBOSE)) && sed 's/^/vm.sh: timing: /' "$R/host_timings" >&2
[[ -n $TIMING_FILE ]] && cat "$R/host_timings" >> "$TIMING_FILE"
exit "$status"
