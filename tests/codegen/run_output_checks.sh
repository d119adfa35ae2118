#!/bin/bash
# Checks on what protoc-gen-verbrpc writes, beyond "it compiles" (which
# vrpc_cg_protos proves): the .proto's comments are carried into the header,
# keyword-named methods get escaped handler members, the method id is the
# FNV-1a of the full name, and two runs write identical files.
#   run_output_checks.sh PROTOC PLUGIN PROTOC_GEN_C PROTOS_DIR PROTO_INCLUDE_DIR
set -uo pipefail
PROTOC=$1 PLUGIN=$2 GEN_C=$3 DIR=$4 INC=$5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
gen() { # gen OUT FILE...
    mkdir -p "$1" && "$PROTOC" -I"$DIR" -I"$INC" --plugin=protoc-gen-verbrpc="$PLUGIN" \
        --verbrpc_out=protoc_c="$GEN_C":"$1" "${@:2}"
}
expect() { # expect FILE TEXT WHY
    if grep -qF -- "$2" "$1"; then echo "ok   $3"; else echo "FAIL $3: '$2' not in $1"; fail=1; fi
}

gen "$tmp/a" shop/shop.proto kw/keywords.proto || exit 1
gen "$tmp/b" shop/shop.proto kw/keywords.proto || exit 1
h=$tmp/a/shop/shop.vrpc.h
expect "$h" "Two services in one file; Orders takes and returns messages of another" "file comment"
expect "$h" " * The product catalogue." "service comment"
expect "$h" " * Looks an item up by SKU." "method leading comment"
expect "$h" " * trailing comment" "method trailing comment"
expect "$h" "#define CG__SHOP__V1__CATALOG__LOOKUP__METHOD_ID 0xc4ba8d43u" "method id = FNV-1a 32 of /cg.shop.v1.Catalog/Lookup"
expect "$h" "int cg__shop__v1__orders__nested__call(struct vrpc_channel *ch, const Cg__Common__Item__Dimensions *req" \
    "stub on another package's nested type"
k=$tmp/a/kw/keywords.vrpc.h
expect "$k" "void (*return_)(struct vrpc_server_call *call, const Int__Switch__Static__Struct *req, void *user);" \
    "keyword method gets an escaped member"
expect "$k" "void (*user_)(" "method named like the impl's user pointer is escaped"
expect "$tmp/a/kw/keywords.pb-c.h" "void (*return_)(" "protoc-c's own service struct escaped too"
expect "$tmp/a/kw/keywords.pb-c.h" "int64_t errno_;" "field named like a libc macro escaped for protoc-c"
gen "$tmp/s" stream/feeds.proto || exit 1
sh=$tmp/s/stream/feeds.vrpc.h sc=$tmp/s/stream/feeds.vrpc.c
expect "$sh" "#include <verbrpc/stream.h>" "a file with streams includes stream.h"
expect "$h" "#include <verbrpc/rpc.h>" "a file without streams includes rpc.h only"
expect "$sc" ".kind = VRPC_METHOD_UNARY," "unary descriptor names its kind"
expect "$sc" ".kind = VRPC_METHOD_SERVER_STREAMING," "server-streaming descriptor"
expect "$sc" ".kind = VRPC_METHOD_CLIENT_STREAMING," "client-streaming descriptor"
expect "$sc" ".kind = VRPC_METHOD_BIDI_STREAMING," "bidi descriptor"
expect "$sh" "/* ---- rpc Trade(stream cg.stream.v1.Order) returns (stream cg.stream.v1.Order.Fill), bidirectional streaming ---- */" \
    "stream banner"
expect "$sh" " * Every tick of a symbol until the client cancels: server streaming." "stream method comment carried"
expect "$sh" " * trailing comment on Trade" "stream method trailing comment carried"
expect "$sh" "int cg__stream__v1__ticker__subscribe__start(struct vrpc_channel *ch, const Cg__Stream__V1__Symbol *req," \
    "server-streaming start takes the request"
expect "$sh" "int cg__stream__v1__ticker__subscribe__read(struct vrpc_stream *s, Cg__Stream__V1__Tick **msg);" "typed read"
expect "$sh" "int cg__stream__v1__ticker__upload__write(struct vrpc_stream *s, const Cg__Stream__V1__Tick *msg);" "typed write"
expect "$sh" "int cg__stream__v1__ticker__upload__finish(struct vrpc_stream *s, Cg__Stream__V1__Summary **resp," \
    "client-streaming finish returns the response"
expect "$sh" "int cg__stream__v1__ticker__upload__respond(struct vrpc_server_stream *s, const Cg__Stream__V1__Summary *resp);" \
    "client-streaming server respond"
expect "$sh" "int cg__stream__v1__ticker__trade__send(struct vrpc_server_stream *s, const Cg__Stream__V1__Order__Fill *msg);" \
    "typed server send on a nested type"
expect "$sh" "    Cg__Stream__V1__Ticker_Subscribe_StreamOps subscribe;" "impl struct has a typed ops member"
expect "$sh" "    void (*quote)(struct vrpc_server_call *call, const Cg__Stream__V1__Symbol *req, void *user);" \
    "unary member next to stream members"
expect "$sh" "    Cg__Stream__V1__Keywords_Return_StreamOps return_;" "keyword stream member escaped"
expect "$sh" "    Cg__Stream__V1__Keywords_User_StreamOps user_;" "stream member named user escaped"
expect "$sh" "int cg__stream__v1__inventory__changes__start(struct vrpc_channel *ch, const Google__Protobuf__Empty *req," \
    "stream of well-known types"
expect "$sc" "vrpc_server_register_stream(s, &cg__stream__v1__ticker__trade__method, &cg__stream__v1__ticker__trade__stream_ops, u)" \
    "streams registered through vrpc_server_register_stream"
gen "$tmp/s2" stream/feeds.proto || exit 1
if diff -r "$tmp/s" "$tmp/s2" >/dev/null; then echo "ok   deterministic stream output"; else echo "FAIL stream output differs"; fail=1; fi
if diff -r "$tmp/a" "$tmp/b" >/dev/null; then echo "ok   deterministic output"; else echo "FAIL output differs between runs"; fail=1; fi
exit $fail
