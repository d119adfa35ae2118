/* The verbrpc command-line tool: what its subcommands share. Each command
 * is one function in the table of main.c: it gets argv from its own name on
 * and returns the process's exit code. */
#ifndef VRPC_TOOL_TOOL_H
#define VRPC_TOOL_TOOL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <verbrpc/verbrpc.h>

#include "descpool.h"

/* Exit codes, the same for every command (those of grpc_health_probe). */
enum {
    EXIT_OK = 0,
    EXIT_USAGE = 1,     /* bad arguments, bad URI, unreadable or invalid input */
    EXIT_CONNECT = 2,   /* could not connect within the timeout */
    EXIT_RPC = 3,       /* the call failed (its status code and message are printed) */
    EXIT_UNHEALTHY = 4, /* health: answered, but not SERVING */
};

#define TOOL_TIMEOUT_DEFAULT_MS 10000

struct tool_conn {
    struct vrpc_channel *ch;
    int64_t timeout_us;
    const char *uri;
};

/* "1.5s", "250ms", "100us", "2m", "3" (seconds) into microseconds; false if bad. */
bool tool_parse_duration(const char *s, int64_t *us);

/* Creates the channel and connects within timeout_us. Prints the reason and
 * returns EXIT_USAGE (bad URI) or EXIT_CONNECT, else 0. */
int tool_connect(struct tool_conn *c, const char *uri, int64_t timeout_us);
void tool_disconnect(struct tool_conn *c);

/* Call options with the connection's timeout (md may be NULL). */
struct vrpc_call_opts tool_call_opts(const struct tool_conn *c, const struct vrpc_metadata *md, size_t n_md);

/* Prints "CODE: message" of a failed call, prefixed with what was tried, to
 * stderr; returns EXIT_RPC. */
int tool_rpc_failed(const char *what, const struct vrpc_status *st);

/* Adds the files the server's reflection service returns for a symbol (or,
 * by_file, a file name) to pool. The status code; st filled on failure. */
int tool_reflect(struct tool_conn *c, struct descpool *pool, const char *name, bool by_file, struct vrpc_status *st);

int cmd_health(int argc, char **argv);
int cmd_stats(int argc, char **argv);
int cmd_list(int argc, char **argv);
int cmd_describe(int argc, char **argv);
int cmd_call(int argc, char **argv);

#endif
