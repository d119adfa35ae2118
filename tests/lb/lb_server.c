/* The test server of test_lb, a process of its own (the test runs 3 to 5):
 *   test_lb --serve ID PORT BACKEND IP [fail-all]
 * serves vrpctest.Test/Echo and /EchoOnce on BACKEND://IP:PORT (0: any),
 * prints "PORT p" on stdout once listening, and on SIGTERM drains
 * (vrpc_server_shutdown: GOAWAY, in-flight calls answered) and exits 0;
 * SIGUSR1 makes its Health say NOT_SERVING, SIGUSR2 SERVING again.
 * check-only: its Health service has Check alone (no Watch, as an older
 * server's). Echo answers with payload "sID"; the request's mode says how: 0 normal,
 * 1 UNAVAILABLE every other call (per process), 2 UNAVAILABLE always, 3
 * UNAVAILABLE "server is shutting down (the handler ran)"; fail-all
 * makes every call UNAVAILABLE. sleep_ms delays the answer. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <verbrpc/rpc.h>
#include <verbrpc/health.h>
#include <verbrpc/health.vrpc.h>
#include "lb_test.h"
#include "rpc/server_core.h"

static int g_id;
static int g_fail_all;
static int g_check_only;
static int g_check_status = VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING; /* atomic */

/* check-only: a Health service with Check alone (an older server's), its
 * status set by the signals. */
static void check_only(struct vrpc_server_call *call, const Verbrpc__Health__V1__HealthCheckRequest *req, void *user)
{
    (void)req, (void)user;
    Verbrpc__Health__V1__HealthCheckResponse r = VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = __atomic_load_n(&g_check_status, __ATOMIC_RELAXED);
    vrpc_server_call_respond(call, &r.base);
}
static const Verbrpc__Health__V1__Health_VrpcImpl g_check_impl = {.check = check_only};
static unsigned g_count; /* atomic */

static void echo(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    const Vrpctest__EchoRequest *r = (const Vrpctest__EchoRequest *)msg;
    unsigned n = __atomic_fetch_add(&g_count, 1, __ATOMIC_RELAXED);
    if (r->sleep_ms) {
        struct timespec ts = {r->sleep_ms / 1000, (long)(r->sleep_ms % 1000) * 1000000};
        nanosleep(&ts, NULL);
    }
    if (r->mode == 3) { /* processed, with the words of a refusal (t_unprocessed_flag) */
        vrpc_server_call_fail(call, VRPC_UNAVAILABLE, "server is shutting down (the handler ran)");
        return;
    }
    if (g_fail_all || r->mode == 2 || (r->mode == 1 && n % 2 == 0)) {
        vrpc_server_call_fail(call, VRPC_UNAVAILABLE, "test server fails this call");
        return;
    }
    char id[16];
    snprintf(id, sizeof id, "s%d", g_id);
    Vrpctest__EchoReply rep = VRPCTEST__ECHO_REPLY__INIT;
    rep.payload.data = (uint8_t *)id;
    rep.payload.len = strlen(id);
    rep.seq = n; /* how many calls this server has had before */
    vrpc_server_call_respond(call, &rep.base);
}

int lb_serve(int argc, char **argv)
{
    if (argc < 6)
        return 2;
    g_id = atoi(argv[2]);
    g_fail_all = argc > 6 && strcmp(argv[6], "fail-all") == 0;
    g_check_only = argc > 6 && strcmp(argv[6], "check-only") == 0;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* before any thread starts */
    lb_test_methods_init();
    struct vrpc_server *s;
    char uri[128], got[128];
    const char *v6 = strchr(argv[5], ':');
    snprintf(uri, sizeof uri, "%s://%s%s%s:%s", argv[4], v6 ? "[" : "", argv[5], v6 ? "]" : "", argv[3]);
    if (g_check_only ? vrpc_server_core_create(NULL, &s) || verbrpc__health__v1__health__vrpc_register(s, &g_check_impl)
                     : vrpc_server_create(NULL, &s))
        return 1;
    if (vrpc_server_register(s, &lb_m_echo, echo, NULL) || vrpc_server_register(s, &lb_m_once, echo, NULL))
        return 1;
    int rc = -1;
    for (int i = 0; i < 100 && rc; i++) { /* a restarted server: the port may linger */
        rc = vrpc_server_start(s, uri);
        if (rc)
            usleep(20000);
    }
    if (rc || vrpc_server_uri(s, got, sizeof got))
        return 1;
    const char *p = strrchr(got, ':');
    printf("PORT %s\n", p ? p + 1 : "0");
    fflush(stdout);
    int sig;
    while (sigwait(&set, &sig) == 0 && sig != SIGTERM) {
        __atomic_store_n(&g_check_status,
                         sig == SIGUSR2 ? VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                                        : VERBRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING,
                         __ATOMIC_RELAXED);
        if (!g_check_only)
            vrpc_server_set_serving_status(s, "", sig == SIGUSR2 ? VRPC_HEALTH_SERVING : VRPC_HEALTH_NOT_SERVING);
    } /* USR1: NOT_SERVING, USR2: SERVING */
    vrpc_server_shutdown(s, 5000);
    vrpc_server_destroy(s);
    return 0;
}
