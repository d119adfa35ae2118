/* rpc_bench's large-message mode (--payload LIST), see rpc_bench_large.c. */
#ifndef VRPC_BENCH_RPC_LARGE_H
#define VRPC_BENCH_RPC_LARGE_H

#include <stdbool.h>
#include "common/bench.h"

struct rpc_bench_large_cfg {
    const struct vrpc_bench_opts *bo;
    const char *backend, *server_ip, *client_ip;
    const char *payloads; /* "65536,1048576,16777216" */
    unsigned duration_ms; /* per case and round */
    int ccpu, scpu;       /* placement as rpc_bench --placement: client side (caller, channel
                           * threads, stream sender) on ccpu, server side (server threads,
                           * stream sink) on scpu; -1: unpinned */
    bool no_spin;         /* --no-spin: channel and server never busy-wait */
};

/* 0, or 1/2 after printing why. */
int rpc_bench_large(const struct rpc_bench_large_cfg *cfg);

#endif
