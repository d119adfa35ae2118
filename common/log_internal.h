/* Library-private side of the logger (include/verbrpc/log.h): the va_list
 * entry, and each layer's shorthand for its warnings. There is one logger
 * (common/log.c); these only name the subsystem and the level. */
#ifndef VRPC_COMMON_LOG_INTERNAL_H
#define VRPC_COMMON_LOG_INTERNAL_H

#include <stdarg.h>
#include <verbrpc/log.h>

void vrpc_logv(enum vrpc_log_level level, const char *subsys, const char *fmt, va_list ap);

/* One line at VRPC_LOG_WARN for the transport ("transport") or the RPC core
 * ("rpc"); other levels: vrpc_log(level, subsys, ...). */
#define vrpc_tp_log(...) vrpc_log(VRPC_LOG_WARN, "transport", __VA_ARGS__)
#define vrpc_rpc_log(...) vrpc_log(VRPC_LOG_WARN, "rpc", __VA_ARGS__)

#endif
