/* Every environment variable the library reads, in one table (common/env.c,
 * listed in docs/ENV.md): name, range, default, meaning, layer. The
 * environment is read once, at the first use of any knob (pthread_once), each
 * value checked against its range; a value out of range or malformed is
 * ignored (the default stands) and logged once at the first read of that
 * knob, as "<layer>: ignoring NAME=value (want lo..hi)". Any thread. */
#ifndef VRPC_COMMON_ENV_H
#define VRPC_COMMON_ENV_H

#include <stdbool.h>

enum vrpc_env_knob {
    VRPC_ENV_LOG,                /* level: the logger's threshold */
    VRPC_ENV_FAULT,              /* string: the fault transport's spec */
    VRPC_ENV_NO_GATHER,          /* flag */
    VRPC_ENV_SCHED_MEMBARRIER,   /* flag */
    VRPC_ENV_TCP_TEST_EP_GRANTS, /* integer */
    VRPC_ENV_TCP_NO_FLOW_BUSY,   /* flag */
    VRPC_ENV_VERBS_RNR_RETRY,    /* integers ... */
    VRPC_ENV_VERBS_ACK_TIMEOUT,
    VRPC_ENV_VERBS_GID_INDEX,
    VRPC_ENV_VERBS_PROTO_VERSION,
    VRPC_ENV_VERBS_SRQ_LIMIT,
    VRPC_ENV_VERBS_READ_CHUNK,
    VRPC_ENV_VERBS_READ_WINDOW,
    VRPC_ENV_VERBS_READ_CHUNK_BULK, /* ... integers */
    VRPC_ENV_VERBS_TRACE,           /* set: any value, even empty */
    VRPC_ENV_COUNT
};

/* The knob's value: an integer in its range, a level (enum vrpc_log_level),
 * 0/1 for a flag or a "set" knob; its default when unset or ignored. */
long vrpc_env_long(enum vrpc_env_knob k);
static inline bool vrpc_env_flag(enum vrpc_env_knob k) { return vrpc_env_long(k) != 0; }

/* A string knob's value, NULL when unset. Valid until vrpc_env_reload(). */
const char *vrpc_env_str(enum vrpc_env_knob k);

/* Tests only: read the environment again (after setenv/unsetenv), while no
 * other thread reads a knob. */
void vrpc_env_reload(void);

#endif
