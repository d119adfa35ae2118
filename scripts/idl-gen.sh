#!/bin/bash
# idl-gen.sh: the built-in services' generated C (idl/gen/verbrpc/, committed so
# that libverbrpc builds without protoc-gen-verbrpc) against what protoc, the
# plugin and protoc-c make of idl/verbrpc/*.proto today.
#   idl-gen.sh check  PROTOC PLUGIN PROTOC_GEN_C PROTO_INCLUDE_DIR   diff, exit 1 on a difference
#   idl-gen.sh update PROTOC PLUGIN PROTOC_GEN_C PROTO_INCLUDE_DIR   rewrite idl/gen/verbrpc/
# (the test test_idl_gen_current runs check; the target idl_gen_update runs update).
# The check ignores the two version numbers protoc-c writes into each .pb-c.h
# (the oldest libprotobuf-c it accepts, its own version): they name the
# installed protoc-c, not the .proto files.
set -uo pipefail
MODE=$1 PROTOC=$2 PLUGIN=$3 GEN_C=$4 INC=$5
SRC=$(cd "$(dirname "$0")/.." && pwd)
IDL=$SRC/idl
GEN=$IDL/gen/verbrpc
PROTOS=(health stats reflection)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# As verbrpc_generate(... IMPORT_DIRS idl EXPORT_MACRO VRPC_API) did at build time.
mkdir -p "$tmp/new"
for p in "${PROTOS[@]}"; do
    "$PROTOC" -I"$IDL" -I"$INC" --plugin=protoc-gen-verbrpc="$PLUGIN" \
        --verbrpc_out=protoc_c="$GEN_C",export_macro=VRPC_API:"$tmp/new" "$IDL/verbrpc/$p.proto" ||
        { echo "idl-gen: generating verbrpc/$p.proto failed"; exit 1; }
done
files=()
for p in "${PROTOS[@]}"; do
    for e in pb-c.c pb-c.h vrpc.c vrpc.h; do files+=("$p.$e"); done
done

case $MODE in
update)
    mkdir -p "$GEN"
    for f in "${files[@]}"; do cp "$tmp/new/verbrpc/$f" "$GEN/$f" || exit 1; done
    echo "idl-gen: rewrote ${#files[@]} files in idl/gen/verbrpc"
    exit 0 ;;
check) ;;
*) echo "usage: idl-gen.sh check|update PROTOC PLUGIN PROTOC_GEN_C PROTO_INCLUDE_DIR"; exit 2 ;;
esac

norm() { # norm IN OUT: the version numbers of protoc-c's compatibility check replaced
    sed -E -e 's/^#if PROTOBUF_C_VERSION_NUMBER < [0-9]+$/#if PROTOBUF_C_VERSION_NUMBER < (protoc-c'"'"'s minimum)/' \
        -e 's/^#elif [0-9]+ < PROTOBUF_C_MIN_COMPILER_VERSION$/#elif (protoc-c'"'"'s version) < PROTOBUF_C_MIN_COMPILER_VERSION/' \
        "$1" >"$2"
}
mkdir -p "$tmp/a/verbrpc" "$tmp/b/verbrpc"
fail=0
for f in "${files[@]}"; do
    if [[ ! -f $GEN/$f ]]; then echo "FAIL idl/gen/verbrpc/$f is missing"; fail=1; continue; fi
    norm "$GEN/$f" "$tmp/a/verbrpc/$f" && norm "$tmp/new/verbrpc/$f" "$tmp/b/verbrpc/$f" || exit 1
done
extra=$(cd "$GEN" && ls | grep -vxF -f <(printf '%s\n' "${files[@]}"))
if [[ -n $extra ]]; then echo "FAIL idl/gen/verbrpc holds files nothing generates: $extra"; fail=1; fi
if ! (cd "$tmp" && diff -ru a b); then
    echo "FAIL idl/gen/verbrpc differs from what idl/verbrpc/*.proto generate now (- committed, + regenerated)"
    fail=1
fi
if [[ $fail != 0 ]]; then
    echo "to update the committed copy: cmake --build <build> --target idl_gen_update (then review and commit idl/gen)"
    exit 1
fi
echo "ok   idl/gen/verbrpc matches ${#files[@]} regenerated files"
