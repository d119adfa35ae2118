#!/bin/bash
# Bad input for protoc-gen-verbrpc: every .proto in bad/ must fail, and the
# error must contain each "// expect: TEXT" line of that file (file name,
# line, column and reason). Also checks that an unknown generator option is
# refused by name.
#   run_bad_input.sh PROTOC PLUGIN PROTOC_GEN_C BAD_DIR
set -uo pipefail
PROTOC=$1 PLUGIN=$2 GEN_C=$3 DIR=$4
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail=0

for proto in "$DIR"/*.proto; do
    name=$(basename "$proto")
    bad=0
    err=$("$PROTOC" -I"$DIR" --plugin=protoc-gen-verbrpc="$PLUGIN" \
        --verbrpc_out=protoc_c="$GEN_C":"$out" "$name" 2>&1)
    rc=$?
    if ((rc == 0)); then
        echo "FAIL $name: protoc succeeded, expected an error"; fail=1; rm -rf "${out:?}"/*; continue
    fi
    while IFS= read -r want; do
        if [[ $err != *"$want"* ]]; then
            echo "FAIL $name: error lacks: $want"; echo "  got: $err"; bad=1
        fi
    done < <(sed -n 's|^// expect: ||p' "$proto")
    if [[ -n $(find "$out" -type f) ]]; then
        echo "FAIL $name: files were written despite the error"; bad=1; rm -rf "${out:?}"/*
    fi
    if ((bad)); then fail=1; else echo "ok   $name: $(head -1 <<<"$err")"; fi
done

err=$("$PROTOC" -I"$DIR" --plugin=protoc-gen-verbrpc="$PLUGIN" --verbrpc_out=bogus=1:"$out" clash.proto 2>&1)
if [[ $? == 0 || $err != *"unknown or empty generator option 'bogus'"* ]]; then
    echo "FAIL unknown option: $err"; fail=1
else
    echo "ok   unknown option: $err"
fi
exit $fail
