/* test_lb's server processes (fork + exec of the test program itself with
 * --serve) and its methods. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "lb_test.h"

#define M(name)                                                                                                        \
    {                                                                                                                  \
        "/vrpctest.Test/" name, 0, &vrpctest__echo_request__descriptor, &vrpctest__echo_reply__descriptor, NULL,       \
            VRPC_METHOD_UNARY                                                                                          \
    }
struct vrpc_method_desc lb_m_echo = M("Echo");
struct vrpc_method_desc lb_m_once = M("EchoOnce");

const char *lb_backend = "tcp", *lb_server_ip = "127.0.0.1", *lb_client_ip;

void lb_test_methods_init(void)
{
    lb_m_echo.id = vrpc_method_id(lb_m_echo.full_name);
    lb_m_once.id = vrpc_method_id(lb_m_once.full_name);
}

int lb_srv_start(struct lb_srv *s, int id, int port, const char *extra)
{
    int fd[2];
    if (pipe(fd))
        return -1;
    char ids[16], ports[16];
    snprintf(ids, sizeof ids, "%d", id);
    snprintf(ports, sizeof ports, "%d", port);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a test that crashed */
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        execl("/proc/self/exe", "test_lb", "--serve", ids, ports, lb_backend, lb_server_ip,
              extra ? extra : (char *)NULL, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    FILE *f = fdopen(fd[0], "r");
    char line[64] = "";
    int got = f && fgets(line, sizeof line, f) && sscanf(line, "PORT %d", &s->port) == 1;
    if (f)
        fclose(f);
    else
        close(fd[0]);
    s->pid = pid;
    s->id = id;
    if (!got) {
        lb_srv_stop(s, SIGKILL);
        return -1;
    }
    const char *v6 = strchr(lb_server_ip, ':');
    snprintf(s->uri, sizeof s->uri, "%s://%s%s%s:%d", lb_backend, v6 ? "[" : "", lb_server_ip, v6 ? "]" : "", s->port);
    return 0;
}

void lb_srv_stop(struct lb_srv *s, int sig)
{
    if (s->pid <= 0)
        return;
    kill(s->pid, sig);
    int st;
    while (waitpid(s->pid, &st, 0) < 0 && errno == EINTR)
        ;
    s->pid = 0;
}

void lb_target(const struct lb_srv *v, int n, char *buf, size_t cap)
{
    size_t len = (size_t)snprintf(buf, cap, "list://");
    for (int i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? "," : "", v[i].uri);
}
