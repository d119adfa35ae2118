#!/bin/bash
# The kvstore example's streams as the README shows them: a `watch` on a
# prefix sees the Puts, Deletes and a `bulkput` under it (and nothing else),
# in order, then stops by itself after COUNT changes; a `bulkput` reports
# its counts; a watch still open when the server shuts down ends at once
# (UNAVAILABLE) instead of holding the drain up.
#   run_kvstore_streams.sh KVSTORE_SERVER KVSTORE_CLIENT
set -uo pipefail
server=$1 client=$2
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do echo "--- $f"; cat "$f"; done; exit 1; }
wait_for() { # wait_for FILE TEXT: at most 10 s
    for _ in $(seq 100); do grep -qF -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}

"$server" --listen tcp://127.0.0.1:0 --uri-file "$tmp/uri" >"$tmp/server.log" 2>&1 &
spid=$!
pids+=("$spid")
wait_for "$tmp/uri" "://" || fail "server did not start"
uri=$(cat "$tmp/uri")
kv() { "$client" --connect "$uri" "$@"; }

# 2 puts + 1 delete + 3 bulk pairs under "w/" = 6 changes; "x/" is not watched.
kv watch w/ 6 >"$tmp/watch.log" 2>&1 &
wpid=$!
pids+=("$wpid")
wait_for "$tmp/watch.log" "watching 'w/'" || fail "the watch did not start"
kv put x/other 1 >/dev/null || fail "put x/other"
kv put w/a hello >/dev/null || fail "put w/a"
kv put w/a again >/dev/null || fail "put w/a again"
kv delete w/a >/dev/null || fail "delete w/a"
kv delete w/never >/dev/null || fail "delete w/never" # absent: no change
kv bulkput w/b 3 4 >"$tmp/bulk.log" 2>&1 || fail "bulkput under w/"
wait "$wpid" || fail "watch exited $?"
want=$'watching \'w/\'\nput w/a "hello"\nput w/a "again"\ndelete w/a\nput w/b00000000 "abcd"\nput w/b00000001 "bcde"\nput w/b00000002 "cdef"\nwatch: 6 changes'
[[ $(cat "$tmp/watch.log") == "$want" ]] || fail "watch printed:
$(cat "$tmp/watch.log")
wanted:
$want"
grep -qF "bulkput: 3 pairs stored, 3 new" "$tmp/bulk.log" || fail "bulkput counts"
echo "ok   watch saw the 6 changes under w/, in order"

kv bulkput bulk/ 5000 64 >"$tmp/bulk2.log" 2>&1 || fail "bulkput of 5000 pairs"
grep -qF "bulkput: 5000 pairs stored, 5000 new" "$tmp/bulk2.log" || fail "bulkput 5000 counts"
kv get bulk/00004999 | grep -qF "bulk/00004999" || fail "last bulk pair not stored"
kv bulkput bulk/ 10 >"$tmp/bulk3.log" 2>&1 || fail "bulkput replacing"
grep -qF "bulkput: 10 pairs stored, 0 new" "$tmp/bulk3.log" || fail "bulkput replacing counts"
echo "ok   bulkput: $(cat "$tmp/bulk2.log")"

# A watch open at shutdown (no count): ends UNAVAILABLE, the server drains.
kv watch "" >"$tmp/watch2.log" 2>&1 &
w2=$!
pids+=("$w2")
wait_for "$tmp/watch2.log" "watching ''" || fail "the second watch did not start"
kill -INT "$spid"
wait "$spid"; src=$?
((src == 0)) || fail "server exited $src"
grep -qF "shut down" "$tmp/server.log" || fail "server did not shut down"
grep -qF "(calls still in flight were dropped)" "$tmp/server.log" && fail "the open watch held the drain up"
wait "$w2"; wrc=$?
((wrc == 1)) || fail "the open watch exited $wrc, wanted 1"
grep -qF "watch ended: UNAVAILABLE" "$tmp/watch2.log" || fail "the open watch did not end UNAVAILABLE"
echo "ok   an open watch ended UNAVAILABLE at shutdown and did not hold the drain"
