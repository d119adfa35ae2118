/* The etcd process of the etcd tests (etcd_harness.h). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include "etcd_harness.h"
#include "rpc/etcd_client.h"

const char *etcd_binary(void)
{
    const char *b = getenv("VRPC_ETCD");
    if (b && *b)
        return access(b, X_OK) ? NULL : b;
    return access("/usr/bin/etcd", X_OK) ? NULL : "/usr/bin/etcd";
}

/* A port nothing listens on now (bound and released). */
static int free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &len))
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* Whether etcd answers a range call within timeout_ms. */
static bool etcd_ready(struct etcd_proc *e, int timeout_ms)
{
    struct vrpc_etcd_client c;
    char why[128], msg[128];
    bool ok = false;
    if (vrpc_etcd_client_init(&c, e->endpoint, why, sizeof why))
        return false;
    for (int waited = 0; waited < timeout_ms && !ok; waited += 100) {
        json_t *req = json_pack("{s:s}", "key", "AA=="), *resp = NULL;
        ok = vrpc_etcd_call(&c, "/v3/kv/range", req, 1000, &resp, msg, sizeof msg) == 0;
        json_decref(req);
        json_decref(resp);
        if (!ok)
            usleep(100 * 1000);
    }
    vrpc_etcd_client_fini(&c);
    return ok;
}

static bool spawn(struct etcd_proc *e)
{
    char data[128], curl[64], purl[64], cluster[96], log[128];
    snprintf(data, sizeof data, "%s/data", e->dir);
    snprintf(log, sizeof log, "%s/etcd.log", e->dir);
    snprintf(curl, sizeof curl, "http://127.0.0.1:%d", e->client_port);
    snprintf(purl, sizeof purl, "http://127.0.0.1:%d", e->peer_port);
    snprintf(cluster, sizeof cluster, "t=%s", purl);
    if ((e->pid = fork()) < 0)
        return false;
    if (e->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a crashed test leaves no etcd behind */
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(etcd_binary(), "etcd", "--name", "t", "--data-dir", data, "--listen-client-urls", curl,
              "--advertise-client-urls", curl, "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
              "--initial-cluster", cluster, "--logger", "zap", "--log-level", "warn", (char *)NULL);
        _exit(127);
    }
    if (etcd_ready(e, 30000))
        return true;
    fprintf(stderr, "etcd on %s did not answer within 30 s (log: %s)\n", e->endpoint, log);
    etcd_kill(e);
    return false;
}

bool etcd_start(struct etcd_proc *e)
{
    memset(e, 0, sizeof *e);
    snprintf(e->dir, sizeof e->dir, "/tmp/vrpc-etcd-XXXXXX");
    if (!mkdtemp(e->dir))
        return false;
    e->client_port = free_port();
    e->peer_port = free_port();
    if (e->client_port < 0 || e->peer_port < 0 || e->client_port == e->peer_port)
        return false;
    snprintf(e->endpoint, sizeof e->endpoint, "127.0.0.1:%d", e->client_port);
    return spawn(e);
}

bool etcd_restart(struct etcd_proc *e) { return spawn(e); }

void etcd_kill(struct etcd_proc *e)
{
    if (e->pid > 0) {
        kill(e->pid, SIGKILL);
        waitpid(e->pid, NULL, 0);
        e->pid = 0;
    }
}

void etcd_stop(struct etcd_proc *e)
{
    char cmd[128];
    etcd_kill(e);
    if (e->dir[0] && !strncmp(e->dir, "/tmp/vrpc-etcd-", 15)) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", e->dir);
    }
}
