/* test_lb's pieces: the methods, the server processes. */
#ifndef VRPC_TESTS_LB_TEST_H
#define VRPC_TESTS_LB_TEST_H

#include <pthread.h>
#include <sys/types.h>
#include <verbrpc/rpc.h>
#include "rpc_test.pb-c.h"

extern struct vrpc_method_desc lb_m_echo; /* /vrpctest.Test/Echo: retried when idempotent */
extern struct vrpc_method_desc lb_m_once; /* /vrpctest.Test/EchoOnce: never marked idempotent */
void lb_test_methods_init(void);

/* The server side (lb_server.c): argv = test_lb --serve ID PORT BACKEND IP [fail-all]. */
int lb_serve(int argc, char **argv);

/* Where the servers listen and the client binds (lb_procs.c; main sets them
 * from --backend/--setup): "tcp", "127.0.0.1", NULL by default. */
extern const char *lb_backend, *lb_server_ip, *lb_client_ip;

struct lb_srv {
    pid_t pid;
    int id, port;
    char uri[96];
};
/* Start server id (port 0: any) as a child process; 0 or -1. */
int lb_srv_start(struct lb_srv *s, int id, int port, const char *extra);
/* Send sig and wait for the process (SIGKILL: at once; SIGTERM: it drains). */
void lb_srv_stop(struct lb_srv *s, int sig);
/* "list://BACKEND://IP:p1,..." of n servers. */
void lb_target(const struct lb_srv *v, int n, char *buf, size_t cap);

#endif
