/* jobs_server: serves examples.jobs.v1.Jobs with deferred answers. The
 * handler only queues the call; one job thread answers every job when its
 * work time is over, or fails it early once the call is cancelled (by the
 * client, or by its deadline passing). Handlers thus never block a worker.
 *   jobs_server [--listen URI] [--threads N] [--uri-file PATH] */
#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <verbrpc/verbrpc.h>

#include "ex_util.h"
#include "jobs/jobs.vrpc.h"

/* One queued job. It lives in the call's arena (vrpc_server_call_alloc), so
 * it is gone once the call is answered: read what is needed before answering. */
struct job {
    struct vrpc_server_call *call;
    const Examples__Jobs__V1__JobRequest *req;
    int64_t start_ns;
    struct job *next;
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct job *queue; /* handed over by handlers */
    bool stop;
} jobs = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, false};

/* Handler, on a scheduler worker: queue the call and return without answering. */
static void run(struct vrpc_server_call *call, const Examples__Jobs__V1__JobRequest *req, void *user)
{
    struct job *j = vrpc_server_call_alloc(call, sizeof *j);

    (void)user;
    if (!j) {
        vrpc_server_call_fail(call, VRPC_RESOURCE_EXHAUSTED, "no memory for the job");
        return;
    }
    j->call = call;
    j->req = req;
    j->start_ns = ex_now_ns();
    pthread_mutex_lock(&jobs.lock);
    j->next = jobs.queue;
    jobs.queue = j;
    pthread_cond_signal(&jobs.cond);
    pthread_mutex_unlock(&jobs.lock);
}

/* Answers one job; returns true when it is done (answered or failed). */
static bool step(struct job *j, int64_t now)
{
    int64_t worked_ms = (now - j->start_ns) / 1000000;
    Examples__Jobs__V1__JobReply reply = EXAMPLES__JOBS__V1__JOB_REPLY__INIT;
    char tenant[64] = "";
    const void *v;
    size_t vlen;

    if (vrpc_server_call_is_cancelled(j->call)) {
        /* Cancelled by the client, or its deadline passed (then the server has
         * already answered DEADLINE_EXCEEDED and this returns -ETIMEDOUT):
         * either way the call is released. */
        vrpc_server_call_fail(j->call, VRPC_CANCELLED, "job stopped early");
        return true;
    }
    if (worked_ms < j->req->work_ms)
        return false;
    if (vrpc_server_call_metadata_get(j->call, "tenant", &v, &vlen) == 0)
        snprintf(tenant, sizeof tenant, "%.*s", (int)(vlen < sizeof tenant ? vlen : sizeof tenant - 1),
                 (const char *)v);
    reply.name = j->req->name; /* the request stays valid until the answer */
    reply.tenant = tenant;
    reply.worked_ms = (uint32_t)worked_ms;
    examples__jobs__v1__jobs__run__respond(j->call, &reply);
    return true;
}

/* The job thread: every millisecond, finishes the jobs whose time has come. */
static void *job_thread(void *arg)
{
    struct job *active = NULL;
    struct timespec tick = {0, 1000000};

    (void)arg;
    for (;;) {
        pthread_mutex_lock(&jobs.lock);
        while (!jobs.queue && !active && !jobs.stop)
            pthread_cond_wait(&jobs.cond, &jobs.lock);
        bool stop = jobs.stop;
        while (jobs.queue) { /* move new jobs to the private list */
            struct job *j = jobs.queue;
            jobs.queue = j->next;
            j->next = active;
            active = j;
        }
        pthread_mutex_unlock(&jobs.lock);
        if (stop && !active)
            return NULL;
        int64_t now = ex_now_ns();
        for (struct job **p = &active; *p;) {
            struct job *j = *p, *next = j->next;
            if (step(j, now))
                *p = next; /* j is gone with its call */
            else
                p = &j->next;
        }
        if (active)
            nanosleep(&tick, NULL);
    }
}

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [--listen URI] [--threads N] [--uri-file PATH]\n"
            "  --listen URI      where to listen (default tcp://127.0.0.1:7072; port 0 picks one)\n"
            "  --threads N       scheduler workers running handlers (default 2)\n"
            "  --uri-file PATH   write the bound URI to PATH once listening\n"
            "Serves examples.jobs.v1.Jobs, answering each job from a job thread; Ctrl-C stops it.\n",
            argv0);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"listen", required_argument, NULL, 'l'},
        {"threads", required_argument, NULL, 't'},
        {"uri-file", required_argument, NULL, 'u'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    static const Examples__Jobs__V1__Jobs_VrpcImpl impl = {.run = run};
    const char *listen_uri = "tcp://127.0.0.1:7072", *uri_file = NULL;
    struct vrpc_server_opts o;
    struct vrpc_server *s = NULL;
    unsigned long long v;
    pthread_t thr;
    char bound[256];
    int c, rc;

    ex_block_signals();
    vrpc_server_opts_init(&o);
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'l':
            listen_uri = optarg;
            break;
        case 'u':
            uri_file = optarg;
            break;
        case 't':
            if (!ex_parse_uint(optarg, &v) || v == 0 || v > 1024) {
                fprintf(stderr, "%s: --threads wants a number from 1 to 1024\n", argv[0]);
                return 2;
            }
            o.threads = (unsigned)v;
            break;
        case 'h':
            usage(stdout, argv[0]);
            return 0;
        default:
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (optind != argc) {
        usage(stderr, argv[0]);
        return 2;
    }
    if (pthread_create(&thr, NULL, job_thread, NULL)) {
        fprintf(stderr, "jobs_server: cannot start the job thread\n");
        return 1;
    }
    rc = vrpc_server_create(&o, &s);
    if (rc == 0)
        rc = examples__jobs__v1__jobs__vrpc_register(s, &impl);
    if (rc == 0)
        rc = vrpc_server_start(s, listen_uri);
    if (rc == 0)
        rc = vrpc_server_uri(s, bound, sizeof(bound));
    if (rc != 0) {
        fprintf(stderr, "jobs_server: cannot serve on %s: %s\n", listen_uri, strerror(-rc));
        vrpc_server_destroy(s);
    } else {
        printf("jobs_server: listening on %s\n", bound);
        fflush(stdout);
        if (uri_file && (rc = ex_write_file(uri_file, bound)) != 0)
            fprintf(stderr, "jobs_server: cannot write %s: %s\n", uri_file, strerror(-rc));
        ex_wait_for_signal();
        /* Shutdown waits for the job thread to answer what is in flight. */
        rc = vrpc_server_shutdown(s, 3000);
        printf("jobs_server: shut down%s\n", rc == 0 ? "" : " (jobs still running were dropped)");
        rc = 0;
    }
    pthread_mutex_lock(&jobs.lock);
    jobs.stop = true;
    pthread_cond_signal(&jobs.cond);
    pthread_mutex_unlock(&jobs.lock);
    pthread_join(thr, NULL); /* answers left after shutdown only release their calls */
    vrpc_server_destroy(s);
    return rc == 0 ? 0 : 1;
}
