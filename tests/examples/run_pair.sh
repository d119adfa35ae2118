#!/bin/bash
# run_pair.sh SERVER CLIENT [CLIENT-ARGS...]: starts SERVER on a free port of
# 127.0.0.1, runs CLIENT against it, then stops the server with SIGINT
# (graceful shutdown). Passes when the client exits 0 and the server shuts
# down cleanly; prints both outputs.
set -uo pipefail
server=$1 client=$2; shift 2
tmp=$(mktemp -d)
trap 'kill -9 $pid 2>/dev/null; rm -rf "$tmp"' EXIT
"$server" --listen tcp://127.0.0.1:0 --uri-file "$tmp/uri" >"$tmp/server.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -s $tmp/uri ]] && break; sleep 0.1; done
[[ -s $tmp/uri ]] || { echo "server did not start"; cat "$tmp/server.log"; exit 1; }
"$client" --connect "$(cat "$tmp/uri")" "$@"; crc=$?
kill -INT $pid; wait $pid; src=$?
echo "--- server"; cat "$tmp/server.log"
((crc == 0)) || { echo "client exited $crc"; exit 1; }
((src == 0)) || { echo "server exited $src"; exit 1; }
grep -q "shut down" "$tmp/server.log" || { echo "server did not shut down gracefully"; exit 1; }
