/* jobs_client: walks through deadlines, cancellation, metadata and deferred
 * answers against jobs_server, printing each outcome; exits 0 only when every
 * outcome is the expected one.
 *   jobs_client [--connect URI] */
#include <getopt.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <verbrpc/verbrpc.h>

#include "ex_util.h"
#include "jobs/jobs.vrpc.h"

#define PARALLEL 8

static int failures;

static void expect(const char *what, int code, int want, const char *detail)
{
    printf("%-44s %-18s %s\n", what, vrpc_code_name(code), detail ? detail : "");
    if (code != want) {
        printf("  expected %s\n", vrpc_code_name(want));
        failures++;
    }
}

/* Completion of the async calls: records the code; the arg is a slot. */
struct done_slot {
    Examples__Jobs__V1__Jobs_Run_Async a;
    atomic_int code; /* -1 until done */
    char detail[VRPC_STATUS_MSG_MAX + 32];
};

static void on_done(const struct vrpc_status *st, const Examples__Jobs__V1__JobReply *resp, void *arg)
{
    struct done_slot *d = arg;
    if (resp) /* valid only during the callback: copy what is kept */
        snprintf(d->detail, sizeof d->detail, "tenant=%s worked %u ms", resp->tenant, resp->worked_ms);
    else
        snprintf(d->detail, sizeof d->detail, "%s", st->message);
    atomic_store(&d->code, (int)st->code);
}

static void wait_done(struct done_slot *d, int n)
{
    struct timespec ms = {0, 1000000};
    for (int i = 0; i < n; i++)
        while (atomic_load(&d[i].code) < 0)
            nanosleep(&ms, NULL);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"connect", required_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *uri = "tcp://127.0.0.1:7072";
    struct vrpc_channel *ch = NULL;
    struct vrpc_status st;
    char detail[VRPC_STATUS_MSG_MAX + 64];
    int c, rc;

    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == 'c') {
            uri = optarg;
        } else {
            fprintf(c == 'h' ? stdout : stderr, "usage: %s [--connect URI]  (default tcp://127.0.0.1:7072)\n", argv[0]);
            return c == 'h' ? 0 : 2;
        }
    }
    if ((rc = vrpc_channel_create(uri, NULL, &ch)) != 0) {
        fprintf(stderr, "jobs_client: bad target %s: %s\n", uri, strerror(-rc));
        return 2;
    }

    /* 1. Metadata and a deadline that is long enough. */
    {
        static const char tenant[] = "acme";
        const struct vrpc_metadata md[] = {{"tenant", tenant, sizeof tenant - 1}};
        struct vrpc_call_opts opts = {.timeout_us = 1000000, .md = md, .md_count = 1};
        Examples__Jobs__V1__JobRequest req = EXAMPLES__JOBS__V1__JOB_REQUEST__INIT;
        Examples__Jobs__V1__JobReply *resp;
        req.name = "report";
        req.work_ms = 20;
        rc = examples__jobs__v1__jobs__run__call(ch, &req, &resp, &opts, &st);
        if (rc == VRPC_OK) /* resp lives in this thread's arena until its next call */
            snprintf(detail, sizeof detail, "name=%s tenant=%s worked %u ms", resp->name, resp->tenant,
                     resp->worked_ms);
        else
            snprintf(detail, sizeof detail, "%s", st.message);
        expect("20 ms job, 1 s deadline, tenant=acme:", rc, VRPC_OK, detail);
    }

    /* 2. A deadline shorter than the job: the server answers DEADLINE_EXCEEDED
     *    itself and the job thread sees the call cancelled. */
    {
        struct vrpc_call_opts opts = {.timeout_us = 100000};
        Examples__Jobs__V1__JobRequest req = EXAMPLES__JOBS__V1__JOB_REQUEST__INIT;
        Examples__Jobs__V1__JobReply *resp;
        int64_t t0 = ex_now_ns();
        req.name = "slow";
        req.work_ms = 2000;
        rc = examples__jobs__v1__jobs__run__call(ch, &req, &resp, &opts, &st);
        snprintf(detail, sizeof detail, "after %lld ms", (long long)((ex_now_ns() - t0) / 1000000));
        expect("2 s job, 100 ms deadline:", rc, VRPC_DEADLINE_EXCEEDED, detail);
    }

    /* 3. Cancel: an async call's id, cancelled from this thread 50 ms later. */
    {
        static struct done_slot d = {.code = -1};
        uint64_t id = 0;
        struct vrpc_call_opts opts = {.timeout_us = VRPC_NO_TIMEOUT, .call_id = &id};
        Examples__Jobs__V1__JobRequest req = EXAMPLES__JOBS__V1__JOB_REQUEST__INIT;
        struct timespec ms50 = {0, 50000000};
        req.name = "cancel-me";
        req.work_ms = 2000;
        d.a.done = on_done;
        d.a.arg = &d;
        rc = examples__jobs__v1__jobs__run__call_async(ch, &req, &opts, &d.a);
        if (rc == 0) {
            nanosleep(&ms50, NULL);
            rc = vrpc_channel_cancel(ch, id);
            wait_done(&d, 1);
            expect("2 s job, cancelled after 50 ms:", atomic_load(&d.code), VRPC_CANCELLED,
                   rc == 0 ? "vrpc_channel_cancel decided it" : "the call had ended already");
        } else {
            expect("2 s job, cancelled after 50 ms:", VRPC_UNKNOWN, VRPC_CANCELLED, strerror(-rc));
        }
    }

    /* 4. Deferred answers: eight 200 ms jobs at once finish together, although
     *    the server has two workers: no handler blocks one. */
    {
        static struct done_slot d[PARALLEL];
        static const char tenant[] = "parallel";
        const struct vrpc_metadata md[] = {{"tenant", tenant, sizeof tenant - 1}};
        struct vrpc_call_opts opts = {.timeout_us = 5000000, .md = md, .md_count = 1};
        Examples__Jobs__V1__JobRequest req = EXAMPLES__JOBS__V1__JOB_REQUEST__INIT;
        int64_t t0 = ex_now_ns();
        int ok = 0;
        req.name = "batch";
        req.work_ms = 200;
        for (int i = 0; i < PARALLEL; i++) {
            atomic_init(&d[i].code, -1);
            d[i].a.done = on_done;
            d[i].a.arg = &d[i];
            if ((rc = examples__jobs__v1__jobs__run__call_async(ch, &req, &opts, &d[i].a)) != 0)
                atomic_store(&d[i].code, (int)VRPC_UNKNOWN);
        }
        wait_done(d, PARALLEL);
        for (int i = 0; i < PARALLEL; i++)
            ok += atomic_load(&d[i].code) == VRPC_OK;
        int64_t ms = (ex_now_ns() - t0) / 1000000;
        snprintf(detail, sizeof detail, "%d of %d OK in %lld ms (one after another: %d ms)", ok, PARALLEL,
                 (long long)ms, PARALLEL * 200);
        expect("8 x 200 ms jobs at once:", ok == PARALLEL ? VRPC_OK : VRPC_UNKNOWN, VRPC_OK, detail);
        if (ok == PARALLEL && ms >= PARALLEL * 200) {
            printf("  expected the jobs to overlap\n");
            failures++;
        }
    }

    vrpc_channel_destroy(ch);
    printf("jobs_client: %s\n", failures ? "UNEXPECTED OUTCOMES" : "every outcome as expected");
    return failures ? 1 : 0;
}
