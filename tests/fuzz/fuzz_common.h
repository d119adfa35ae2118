/* What every harness in tests/fuzz/ shares: the libFuzzer entry point's
 * prototype, and a check that aborts with a message (an abort is what
 * libFuzzer records as a crash, with the input that caused it). */
#ifndef VRPC_FUZZ_COMMON_H
#define VRPC_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond, ...)                                                                                          \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);                                   \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

/* libFuzzer's timeout alarm (SIGALRM) interrupts blocking socket calls, and
 * on a socket with SO_RCVTIMEO Linux does not restart them: connect() and
 * recv() then fail with EINTR. These two finish the call instead. */
static inline int fuzz_connect(int fd, const struct sockaddr *sa, socklen_t len)
{
    if (connect(fd, sa, len) == 0)
        return 0;
    if (errno != EINTR && errno != EINPROGRESS)
        return -1;
    /* The connection goes on in the background; wait for its outcome. */
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int r = poll(&p, 1, 5000);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            errno = r == 0 ? ETIMEDOUT : errno;
            return -1;
        }
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
            return -1;
        errno = err;
        return err ? -1 : 0;
    }
}

/* recv(..., MSG_WAITALL) that an interrupting signal does not cut short. */
static inline ssize_t fuzz_recv_all(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, (char *)buf + got, len - got, MSG_WAITALL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return got ? (ssize_t)got : n;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

#endif
