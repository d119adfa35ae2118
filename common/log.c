/* The one logger (include/verbrpc/log.h): level threshold from VRPC_LOG read
 * once, a user handler or timestamped lines on stderr, no allocation. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <verbrpc/log.h>
#include "common/clock.h"
#include "common/env.h"

static int g_level = VRPC_LOG_WARN; /* atomic */
static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;
/* The handler pair changes under the write side; lines are delivered under
 * the read side, so that set_handler returns only once the old handler is
 * out of every thread. glibc's default rwlock prefers readers, so a handler
 * that logs again from inside itself does not deadlock. */
static pthread_rwlock_t g_hlock = PTHREAD_RWLOCK_INITIALIZER;
static vrpc_log_fn g_fn;
static void *g_arg;

static const char *const names[] = {"off", "error", "warn", "info", "debug"};

const char *vrpc_log_level_name(enum vrpc_log_level level)
{
    return (unsigned)level < sizeof names / sizeof names[0] ? names[level] : "?";
}

int vrpc_log_level_parse(const char *s, enum vrpc_log_level *out)
{
    static const struct {
        const char *name;
        enum vrpc_log_level level;
    } alias[] = {
        {"0", VRPC_LOG_OFF},
        {"none", VRPC_LOG_OFF},
        {"warning", VRPC_LOG_WARN},
    };
    if (!s || !out)
        return -EINVAL;
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcasecmp(s, names[i])) {
            *out = (enum vrpc_log_level)i;
            return 0;
        }
    for (unsigned i = 0; i < sizeof alias / sizeof alias[0]; i++)
        if (!strcasecmp(s, alias[i].name)) {
            *out = alias[i].level;
            return 0;
        }
    return -EINVAL;
}

static void read_env(void)
{
    /* common/env.c: any other value (e.g. the old "1") keeps the default, warn */
    __atomic_store_n(&g_level, (int)vrpc_env_long(VRPC_ENV_LOG), __ATOMIC_RELAXED);
}

void vrpc_log_set_level(enum vrpc_log_level level)
{
    pthread_once(&g_env_once, read_env);
    if ((int)level < VRPC_LOG_OFF)
        level = VRPC_LOG_OFF;
    if (level > VRPC_LOG_DEBUG)
        level = VRPC_LOG_DEBUG;
    __atomic_store_n(&g_level, (int)level, __ATOMIC_RELAXED);
}

enum vrpc_log_level vrpc_log_get_level(void)
{
    pthread_once(&g_env_once, read_env);
    return (enum vrpc_log_level)__atomic_load_n(&g_level, __ATOMIC_RELAXED);
}

bool vrpc_log_enabled(enum vrpc_log_level level)
{
    return level != VRPC_LOG_OFF && (int)level <= (int)vrpc_log_get_level();
}

void vrpc_log_set_handler(vrpc_log_fn fn, void *arg)
{
    pthread_rwlock_wrlock(&g_hlock);
    g_fn = fn;
    g_arg = arg;
    pthread_rwlock_unlock(&g_hlock);
}

/* The default handler: "2026-12-01T20:01:16.123456Z verbrpc warn [transport] line". */
static void to_stderr(enum vrpc_log_level level, const char *subsys, const char *line)
{
    struct timespec ts;
    struct tm tm;
    char stamp[32];
    vrpc_clock_real_ts(&ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    /* one fprintf: stdio locks the stream per call, so lines never interleave */
    fprintf(stderr, "%s.%06ldZ verbrpc %s [%s] %s\n", stamp, ts.tv_nsec / 1000, vrpc_log_level_name(level), subsys,
            line);
}

void vrpc_logv(enum vrpc_log_level level, const char *subsys, const char *fmt, va_list ap)
{
    char line[VRPC_LOG_LINE_MAX];
    if (!vrpc_log_enabled(level))
        return;
    vsnprintf(line, sizeof line, fmt, ap);
    if (!subsys)
        subsys = "app";
    pthread_rwlock_rdlock(&g_hlock);
    if (g_fn)
        g_fn(level, subsys, line, g_arg);
    else
        to_stderr(level, subsys, line);
    pthread_rwlock_unlock(&g_hlock);
}

void vrpc_log(enum vrpc_log_level level, const char *subsys, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vrpc_logv(level, subsys, fmt, ap);
    va_end(ap);
}
