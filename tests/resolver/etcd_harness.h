/* A real etcd (Debian's etcd-server, /usr/bin/etcd) for tests: started on
 * 127.0.0.1 with free ports and a temporary data directory, waited for,
 * killed and removed at the end. Every wait is bounded. */
#ifndef VRPC_TESTS_ETCD_HARNESS_H
#define VRPC_TESTS_ETCD_HARNESS_H

#include <stdbool.h>
#include <sys/types.h>

struct etcd_proc {
    pid_t pid;
    int client_port, peer_port;
    char dir[64];      /* the data directory's parent (temp) */
    char endpoint[64]; /* "127.0.0.1:port" */
};

/* The etcd binary, or NULL if it is not installed ($VRPC_ETCD overrides). */
const char *etcd_binary(void);
/* Pick ports and a directory and start etcd; true once it answers (at most 30 s). */
bool etcd_start(struct etcd_proc *e);
/* Start it again on the same ports and data (after etcd_kill). */
bool etcd_restart(struct etcd_proc *e);
/* SIGKILL and reap (no graceful shutdown: "etcd went away"). */
void etcd_kill(struct etcd_proc *e);
/* Kill and remove the directory. */
void etcd_stop(struct etcd_proc *e);

#endif
