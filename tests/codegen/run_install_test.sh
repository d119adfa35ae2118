#!/bin/bash
# Proves the examples build as a separate CMake project against an installed
# verbrpc: installs BUILD_DIR into a temporary prefix, configures EXAMPLES_DIR
# out of tree with find_package(verbrpc) (which also brings verbrpc_generate()
# and the installed protoc-gen-verbrpc), builds it, then runs the installed-
# built echo_server and echo_client against each other over TCP. Also checks
# the packaging: verbrpc.pc works from the temporary prefix (pkg-config
# --cflags/--libs build and run a program), protoc-gen-verbrpc --version,
# --help for every installed program, the .proto files in share/verbrpc/proto.
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

echo "== packaging: a relocatable verbrpc.pc, --version and --help, the .proto files under share/"
version=$(head -n1 "$EXAMPLES/../VERSION")
pcdir=$tmp/prefix/lib/pkgconfig
test -f "$pcdir/verbrpc.pc"
cflags=$(PKG_CONFIG_PATH=$pcdir pkg-config --cflags verbrpc)
ours=no
for f in $cflags; do
    [[ $f == -I* ]] || continue
    [[ $(realpath -m "${f#-I}") == $(realpath "$tmp/prefix/include") ]] && ours=yes
done
[[ $ours == yes ]] || { echo "pkg-config --cflags verbrpc gives '$cflags', not -I$tmp/prefix/include"; exit 1; }
[[ $(PKG_CONFIG_PATH=$pcdir pkg-config --modversion verbrpc) == "$version" ]]
printf '#include <stdio.h>\n#include <string.h>\n#include <verbrpc/verbrpc.h>\nint main(void) { puts(vrpc_version()); return strcmp(vrpc_version(), VRPC_VERSION_STRING) != 0; }\n' >"$tmp/pc.c"
# shellcheck disable=SC2046
cc "$tmp/pc.c" -o "$tmp/pc" $(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs verbrpc)
[[ $(LD_LIBRARY_PATH=$tmp/prefix/lib "$tmp/pc") == "$version" ]] || { echo "the pkg-config build does not run"; exit 1; }
[[ $("$tmp/prefix/bin/protoc-gen-verbrpc" --version) == "protoc-gen-verbrpc $version" ]] ||
    { echo "protoc-gen-verbrpc --version: $("$tmp/prefix/bin/protoc-gen-verbrpc" --version 2>&1)"; exit 1; }
for prog in "$tmp"/prefix/bin/*; do
    out=$("$prog" --help) || { echo "$prog --help exits $?"; exit 1; }
    grep -q '^usage: ' <<<"$out" || { echo "$prog --help prints no usage"; exit 1; }
done
for p in health stats; do test -f "$tmp/prefix/share/verbrpc/proto/verbrpc/$p.proto"; done
if find "$tmp/prefix/include" -name '*.proto' | grep -q .; then echo ".proto files under include/"; exit 1; fi
echo "ok: pkg-config -> $cflags; protoc-gen-verbrpc $version; $(ls "$tmp/prefix/bin" | tr '\n' ' ')--help each"

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
