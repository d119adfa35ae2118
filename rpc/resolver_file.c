/* file:// targets: one server URI (or bare host:port) per line of a file,
 * '#' to the end of a line a comment, blank lines skipped. The resolver's
 * thread looks at the file (stat: inode, size, mtime, ctime) whenever inotify
 * reports a change in its directory (a file closed after writing, renamed,
 * created, deleted) and at least every poll_ms (10..60000, default 1000; for
 * what inotify misses, e.g. network file systems), and reads it again when
 * it changed:
 *   file:///etc/kv-servers.txt[?poll_ms=N]
 * A file that is missing, unreadable, larger than 1 MiB or has a malformed
 * line (logged with its number) keeps the last set; replace the file by
 * rename so that no reader sees half of it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common/container_of.h"
#include "common/log_internal.h"
#include "rpc/resolver_internal.h"

#define FILE_MAX_BYTES (1 << 20)
#define FILE_DEFAULT_POLL_MS 1000

struct file_resolver {
    struct vrpc_resolver base; /* first: the core's view */
    struct vrpc_rslv_loop loop;
    struct vrpc_rslv_out out;
    char *path;
    uint32_t poll_ms;
    struct stat last; /* what was read last (st_ino 0: nothing yet) */
    int last_err;     /* the failure logged last: not again until it changes */
};

static int file_opt(void *ctx, const char *key, const char *val)
{
    struct file_resolver *r = ctx;
    if (strcmp(key, "poll_ms"))
        return -EINVAL;
    return vrpc_rslv_parse_u32(val, 10, 60000, &r->poll_ms);
}

static bool same_stat(const struct stat *a, const struct stat *b)
{
    return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* One line [b, e): comment cut, trimmed, added. */
static int parse_line(const char *b, const char *e, struct vrpc_uri_set *s, char *why, size_t why_len)
{
    char line[VRPC_RESOLVER_MAX_URI + 1];
    const char *hash = memchr(b, '#', (size_t)(e - b));

    if (hash)
        e = hash;
    while (b < e && (*b == ' ' || *b == '\t'))
        b++;
    while (e > b && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
        e--;
    if (b == e)
        return 0;
    if ((size_t)(e - b) >= sizeof line) {
        snprintf(why, why_len, "longer than %d bytes", VRPC_RESOLVER_MAX_URI - 1);
        return -EINVAL;
    }
    if (memchr(b, '\0', (size_t)(e - b))) {
        snprintf(why, why_len, "a NUL byte");
        return -EINVAL;
    }
    memcpy(line, b, (size_t)(e - b));
    line[e - b] = '\0';
    return vrpc_uri_set_add(s, line, why, why_len);
}

int vrpc_rslv_parse_lines(const char *text, size_t len, struct vrpc_uri_set *s, char *why, size_t why_len)
{
    const char *p = text, *end = text + len;
    char inner[128];
    int lineno = 0, rc;

    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        lineno++;
        inner[0] = '\0';
        if ((rc = parse_line(p, e, s, inner, sizeof inner))) {
            snprintf(why, why_len, "line %d: %s", lineno, inner);
            return rc;
        }
        p = nl ? nl + 1 : end;
    }
    return 0;
}

/* Read and parse the whole file (at most FILE_MAX_BYTES) into s. */
static int read_set(FILE *f, struct vrpc_uri_set *s, char *why, size_t why_len)
{
    char *buf = malloc(FILE_MAX_BYTES + 1);
    size_t n;
    int rc;

    if (!buf)
        return -ENOMEM;
    n = fread(buf, 1, FILE_MAX_BYTES + 1, f);
    if (ferror(f))
        rc = -EIO;
    else if (n > FILE_MAX_BYTES)
        rc = -EFBIG;
    else
        rc = vrpc_rslv_parse_lines(buf, n, s, why, why_len);
    free(buf);
    return rc;
}

/* Read the file if it changed since the last read; keep the last set on failure. */
static void file_round(struct file_resolver *r)
{
    struct vrpc_uri_set s = {0};
    char why[256] = "";
    struct stat st;
    FILE *f = NULL;
    int rc = 0;

    if (stat(r->path, &st))
        rc = -errno;
    else if (r->last.st_ino && same_stat(&st, &r->last))
        return;
    else if (st.st_size > FILE_MAX_BYTES)
        rc = -EFBIG;
    else if (!(f = fopen(r->path, "r")))
        rc = -errno;
    else
        rc = read_set(f, &s, why, sizeof why);
    if (f)
        fclose(f);
    if (rc) {
        if (rc != r->last_err || rc == -EINVAL)
            vrpc_rpc_log("resolver: file '%s': %s; keeping the last set", r->path, why[0] ? why : strerror(-rc));
        r->last_err = rc;
        if (rc == -EINVAL) /* a malformed file (stat succeeded): not re-read until it changes */
            r->last = st;
        vrpc_uri_set_clear(&s);
        return;
    }
    r->last_err = 0;
    r->last = st;
    vrpc_rslv_deliver(&r->out, &s);
}

/* An inotify descriptor watching path's directory, or -1 (then polling only). */
static int watch_dir(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    size_t len = slash == path ? 1 : (size_t)(slash - path);
    int fd;

    if (len >= sizeof dir || (fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) < 0)
        return -1;
    memcpy(dir, path, len);
    dir[len] = '\0';
    if (inotify_add_watch(fd, dir, IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_ATTRIB) <
        0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void file_main(void *arg)
{
    struct file_resolver *r = arg;
    int fd = watch_dir(r->path);
    char events[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    bool ready;

    do {
        /* any event in the directory: look (stat says whether our file changed) */
        while (fd >= 0 && read(fd, events, sizeof events) > 0)
            ;
        file_round(r);
    } while (!vrpc_rslv_loop_wait_fd(&r->loop, fd, r->poll_ms, &ready));
    if (fd >= 0)
        close(fd);
}

static void file_destroy(struct vrpc_resolver *base)
{
    struct file_resolver *r = container_of(base, struct file_resolver, base);
    vrpc_rslv_loop_stop(&r->loop);
    vrpc_rslv_out_fini(&r->out);
    free(r->path);
    free(r);
}

static int file_create(const char *rest, vrpc_resolver_update_fn fn, void *arg, struct vrpc_resolver **out)
{
    struct file_resolver *r = calloc(1, sizeof *r);
    int rc;

    if (!r)
        return -ENOMEM;
    r->base.ops = &vrpc_resolver_file;
    r->poll_ms = FILE_DEFAULT_POLL_MS;
    r->out.fn = fn;
    r->out.arg = arg;
    if ((rc = vrpc_rslv_split_opts("file", rest, &r->path, file_opt, r)))
        goto fail;
    if (r->path[0] != '/' || r->path[1] == '\0') {
        vrpc_rpc_log("resolver: bad target 'file://%s': want file:///absolute/path", rest);
        rc = -EINVAL;
        goto fail;
    }
    if ((rc = vrpc_rslv_loop_start(&r->loop, file_main, r, 0)))
        goto fail;
    *out = &r->base;
    return 0;
fail:
    free(r->path);
    free(r);
    return rc;
}

/* A refresh looks at the file at once (its stat decides whether to read it). */
static void file_refresh(struct vrpc_resolver *base)
{
    struct file_resolver *r = container_of(base, struct file_resolver, base);
    vrpc_rslv_loop_refresh(&r->loop);
}

const struct vrpc_resolver_ops vrpc_resolver_file = {
    .scheme = "file",
    .create = file_create,
    .refresh = file_refresh,
    .destroy = file_destroy,
};
