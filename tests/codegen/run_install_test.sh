#!/bin/bash
# Proves the examples build as a separate CMake project against an installed
# verbrpc: installs BUILD_DIR into a temporary prefix, configures EXAMPLES_DIR
# out of tree with find_package(verbrpc) (which also brings verbrpc_generate()
# and the installed protoc-gen-verbrpc), builds it, then runs the installed-
# built echo_server and echo_client against each other over TCP.
#   run_install_test.sh BUILD_DIR EXAMPLES_DIR
set -euo pipefail
BUILD=$1 EXAMPLES=$2
tmp=$(mktemp -d)
server_pid=
cleanup() {
    [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

echo "== install $BUILD into $tmp/prefix"
cmake --install "$BUILD" --prefix "$tmp/prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; exit 1; }
test -x "$tmp/prefix/bin/protoc-gen-verbrpc"
test -f "$tmp/prefix/lib/cmake/verbrpc/VerbrpcGenerate.cmake"

echo "== configure and build $EXAMPLES against it"
cmake -S "$EXAMPLES" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/build" -j 2 >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
# The plugin that generated the code must be the installed one.
grep -q "$tmp/prefix/bin/protoc-gen-verbrpc" "$tmp/build/CMakeFiles/vrpc_examples_common.dir/build.make" ||
    grep -rq "$tmp/prefix/bin/protoc-gen-verbrpc" "$tmp/build/CMakeFiles" ||
    { echo "the examples were not generated with the installed plugin"; exit 1; }

echo "== run echo_server and echo_client from that build"
"$tmp/build/echo_server" --listen tcp://127.0.0.1:0 --uri-file "$tmp/uri" >"$tmp/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do [[ -s $tmp/uri ]] && break; sleep 0.1; done
[[ -s $tmp/uri ]] || { echo "echo_server did not start"; cat "$tmp/server.log"; exit 1; }
out=$("$tmp/build/echo_client" --connect "$(cat "$tmp/uri")" --count 3 installed and working)
echo "$out"
grep -q 'answered "installed and working"' <<<"$out"
echo "ok: examples built and ran against the installed verbrpc"
