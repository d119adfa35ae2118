/* Where a verbs test case finds its addresses. tests/softroce/run.sh sets them
 * inside the Soft-RoCE VM; on a machine with an RDMA device the user does:
 *   --setup single  VRPC_VERBS_IP for both sides (one device)
 *   --setup veth    client VRPC_VERBS_IP_A, server VRPC_VERBS_IP_B (two hosts)
 * One rule for every test program, so none drifts from the harness. */
#ifndef VRPC_TESTS_VERBS_SETUP_H
#define VRPC_TESTS_VERBS_SETUP_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <verbrpc/transport.h>

/* 0 with *server and *client set (the strings belong to the environment),
 * -EINVAL for an unknown set-up name, -ENOENT when a variable is unset or
 * empty; then a SKIP line has been printed and the caller exits 77. */
static inline int vrpc_test_verbs_addrs(const char *setup, const char **server, const char **client)
{
    const char *s, *c;
    if (!strcmp(setup, "single")) {
        s = c = getenv("VRPC_VERBS_IP");
    } else if (!strcmp(setup, "veth")) {
        s = getenv("VRPC_VERBS_IP_B");
        c = getenv("VRPC_VERBS_IP_A");
    } else {
        fprintf(stderr, "unknown verbs set-up '%s' (single or veth)\n", setup);
        return -EINVAL;
    }
    if (!s || !*s || !c || !*c) {
        printf("SKIP: verbs set-up '%s' needs %s naming RDMA-capable addresses "
               "(tests/softroce/run.sh sets them)\n",
               setup,
               strcmp(setup, "single") ? "VRPC_VERBS_IP_A (client) and VRPC_VERBS_IP_B (server)" : "VRPC_VERBS_IP");
        return -ENOENT;
    }
    *server = s;
    *client = c;
    return 0;
}

/* For a test program's main(): the addresses of backend ("tcp": 127.0.0.1 for
 * the server, no client address; otherwise the verbs set-up above, after
 * checking the backend can be opened here). Returns the exit code to leave
 * with, or 0 to go on: 77 (skipped, a SKIP line printed), 2 (bad set-up). */
static inline int vrpc_test_backend_addrs(const char *backend, const char *setup, const char **server,
                                          const char **client)
{
    struct vrpc_transport *tp;
    int rc;
    if (!strcmp(backend, "tcp")) {
        *server = "127.0.0.1";
        return 0;
    }
    rc = vrpc_test_verbs_addrs(setup, server, client);
    if (rc)
        return rc == -ENOENT ? 77 : 2;
    rc = vrpc_transport_create(backend, NULL, &tp);
    if (rc) {
        printf("SKIP: backend '%s' unavailable here: %s\n", backend, strerror(-rc));
        return 77;
    }
    vrpc_transport_destroy(tp);
    return 0;
}

#endif
