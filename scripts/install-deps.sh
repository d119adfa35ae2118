#!/bin/bash
# install-deps.sh - installs every Debian 12 package that verbrpc's build, tests,
# Soft-RoCE VM tests and benchmarks need. Idempotent and quiet when nothing is missing.
#   scripts/install-deps.sh           build + tests + Soft-RoCE VM
#   scripts/install-deps.sh --bench   also the optional benchmark baselines (gRPC C++)
set -euo pipefail

PKGS=(
    # build
    build-essential cmake pkg-config
    # rdma-core
    rdma-core libibverbs-dev librdmacm-dev ibverbs-providers ibverbs-utils rdmacm-utils
    # protobuf-c and protoc (descriptor.proto in libprotobuf-dev, plugin.proto in libprotoc-dev)
    libprotobuf-c-dev protobuf-c-compiler protobuf-compiler libprotobuf-dev libprotoc-dev
    # concurrency kit, tests
    libck-dev libcmocka-dev
    # the server's Prometheus metrics endpoint (vrpc_server_opts.metrics_addr):
    # an HTTP server library rather than an HTTP parser of our own; optional
    # (VRPC_WITH_METRICS), the library builds without it
    libmicrohttpd-dev
    # JSON for the verbrpc tool (call's requests and responses, stats --json): protobuf-c has no JSON;
    # also etcd discovery's JSON (the gateway's requests, responses and watch messages)
    libjansson-dev
    # etcd discovery (etcd:// targets, vrpc_etcd_register): an HTTP client library for etcd's JSON
    # gateway rather than an HTTP client of our own; optional (VRPC_WITH_ETCD), and the etcd
    # server the tests start (test_etcd skips without /usr/bin/etcd)
    libcurl4-openssl-dev etcd-server
    # sanitizer runtimes (gcc 12)
    libasan8 libubsan1 libtsan2
    # Soft-RoCE VM: qemu, initramfs tools, and what the guest runs from the host root
    qemu-system-x86 busybox-static kmod cpio xz-utils iproute2 bc perftest
    # benchmarks: instruction counts
    valgrind
    # fuzzers (tests/fuzz, make fuzz, the check stage "fuzz"): libFuzzer needs clang
    # (-fsanitize=fuzzer links libclang_rt.fuzzer from libclang-rt-14-dev, a dependency of
    # clang); libfuzzer-14-dev adds the standalone libFuzzer and its FuzzedDataProvider.h
    clang libfuzzer-14-dev
)
if [[ ${1:-} == --bench ]]; then
    PKGS+=(libgrpc++-dev protobuf-compiler-grpc)
fi

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0

if [[ $(id -u) != 0 ]]; then
    echo "install-deps: missing packages: ${missing[*]}; run as root (or: sudo $0)" >&2
    exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
