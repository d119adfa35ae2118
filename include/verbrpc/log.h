/* verbrpc's logging: every line the library writes (transport, RPC core,
 * scheduler) goes through here, with a level, to a handler: by default one
 * line on stderr with a UTC timestamp, or the user's callback.
 *
 * The threshold starts from the environment, read once with the library's
 * other knobs (docs/ENV.md; at the latest at the first line logged or the
 * first call below): VRPC_LOG=off|error|warn|info|debug
 * ("0" and "none" also mean off; unset or unknown: warn). vrpc_log_set_level()
 * overrides it. At VRPC_LOG_OFF nothing is written and no handler is called.
 * Lines are formatted into a fixed buffer (cut at VRPC_LOG_LINE_MAX - 1
 * bytes): logging never allocates. Any thread may log and call these
 * functions at any time. */
#ifndef VERBRPC_LOG_H
#define VERBRPC_LOG_H

#include <stdbool.h>
#include <verbrpc/common.h>

#ifdef __cplusplus
extern "C" {
#endif

enum vrpc_log_level {
    VRPC_LOG_OFF = 0,   /* threshold only: silences everything */
    VRPC_LOG_ERROR = 1, /* the library cannot do what was asked (out of memory, a device failed) */
    VRPC_LOG_WARN = 2,  /* something the peer or the host caused; the library carries on */
    VRPC_LOG_INFO = 3,  /* notable but expected events */
    VRPC_LOG_DEBUG = 4, /* tracing */
};

/* Longest line handed to a handler, including the NUL. */
#define VRPC_LOG_LINE_MAX 512

/* A log handler. subsys names the layer ("transport", "rpc", "sched"); line
 * is the message without a trailing newline. Both are valid only during the
 * call. Runs on the thread that logged (possibly a transport poller or a
 * worker): it must not block for long, and must not call
 * vrpc_log_set_handler(). */
typedef void (*vrpc_log_fn)(enum vrpc_log_level level, const char *subsys, const char *line, void *arg);

/* Send every line at or below the threshold to fn(…, arg); NULL restores the
 * default (stderr). When it returns, the previous handler is no longer
 * running on any thread (its arg may be freed). */
VRPC_API void vrpc_log_set_handler(vrpc_log_fn fn, void *arg);

/* Lines of a level above this are dropped; VRPC_LOG_OFF drops all. Values
 * above VRPC_LOG_DEBUG are taken as VRPC_LOG_DEBUG. */
VRPC_API void vrpc_log_set_level(enum vrpc_log_level level);
VRPC_API enum vrpc_log_level vrpc_log_get_level(void);

/* Whether a line of this level would be written now. */
VRPC_API bool vrpc_log_enabled(enum vrpc_log_level level);

/* "off", "error", "warn", "info", "debug"; "?" out of range. */
VRPC_API const char *vrpc_log_level_name(enum vrpc_log_level level);

/* Parse a level as VRPC_LOG spells it (also "0", "none", "warning"). 0 or -EINVAL. */
VRPC_API int vrpc_log_level_parse(const char *s, enum vrpc_log_level *out);

/* Log one line (printf format) for subsystem subsys (NULL: "app"). */
VRPC_API void vrpc_log(enum vrpc_log_level level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif
#endif
