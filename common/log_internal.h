/* Library-private side of the logger (include/verbrpc/log.h): the va_list
 * entry the layers' own wrappers (vrpc_tp_log, vrpc_rpc_log) forward to. */
#ifndef VRPC_COMMON_LOG_INTERNAL_H
#define VRPC_COMMON_LOG_INTERNAL_H

#include <stdarg.h>
#include <verbrpc/log.h>

void vrpc_logv(enum vrpc_log_level level, const char *subsys, const char *fmt, va_list ap);

#endif
