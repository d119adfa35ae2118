#!/bin/bash
# The examples' error messages say what is wrong: a bad option value names
# the option and its range, a malformed URI is refused at once with the
# reason (before any connect is tried).
#   run_messages_test.sh KVSTORE_CLIENT ECHO_CLIENT
set -uo pipefail
KV=$1 ECHO=$2
fails=0
expect() { # expect EXIT TEXT CMD...
    local want=$1 text=$2 out rc
    shift 2
    out=$("$@" 2>&1); rc=$?
    printf '$ %s\n%s\n' "$*" "$out"
    [[ $rc == "$want" ]] || { echo "FAIL: exit $rc, want $want"; fails=$((fails + 1)); }
    grep -qF -- "$text" <<<"$out" || { echo "FAIL: no '$text'"; fails=$((fails + 1)); }
}
expect 2 "--duration wants seconds from 1 to" "$KV" --duration 0 load
expect 2 "--get-ratio wants a percentage from 0 to 100, not '101'" "$KV" --get-ratio 101 load
expect 2 "--outstanding wants a number from 1 to 4096" "$KV" --outstanding 5000 load
expect 2 "'tcp:' must be followed by '//'" "$KV" --connect tcp:/127.0.0.1:7500 get k
expect 2 "no port" "$KV" --connect 127.0.0.1 get k
expect 2 "port 99999 is out of range" "$ECHO" --connect tcp://127.0.0.1:99999 hi
expect 2 "'[' without ']'" "$ECHO" --connect "tcp://[::1:7500" hi
((fails == 0)) && echo "ok" && exit 0
exit 1
