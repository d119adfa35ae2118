/* The conformance cases defined outside test_transport.c, listed for main(). */
#ifndef VRPC_TEST_TRANSPORT_CASES_H
#define VRPC_TEST_TRANSPORT_CASES_H

/* Entry point of the child process of the peer-crash case (re-executed). */
int peer_child_main(const char *backend, const char *uri);

#define CONFORMANCE_CASES

#endif
