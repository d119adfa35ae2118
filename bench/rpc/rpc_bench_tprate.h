/* The transport's own one-way message rate, the baseline of
 * rpc_bench_stream: one sender thread with one endpoint sends `size`-byte
 * messages as fast as the transport takes them to a server that reposts
 * every receive buffer; counted at the receiver (as transport_bench's
 * transport:*_rate cases do). */
#ifndef VRPC_BENCH_RPC_TPRATE_H
#define VRPC_BENCH_RPC_TPRATE_H

#include <stdint.h>

/* Messages per second received over `secs` seconds after a 100 ms warm-up,
 * on backend between server_ip and client_ip (NULL: any). Exits the program
 * with a message on a setup error. */
double vrpc_bench_tp_rate(const char *backend, const char *server_ip, const char *client_ip, uint32_t size,
                          double secs);

#endif
