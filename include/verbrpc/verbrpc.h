/* verbrpc: the one header users include. */
#ifndef VERBRPC_VERBRPC_H
#define VERBRPC_VERBRPC_H

#include <verbrpc/common.h>
#include <verbrpc/log.h>
#include <verbrpc/sched.h>
#include <verbrpc/transport.h>
#include <verbrpc/rpc.h>
#include <verbrpc/stream.h>
#include <verbrpc/metrics.h>
#include <verbrpc/discovery.h>

#endif
