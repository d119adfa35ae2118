/* protoc-gen-verbrpc: protoc plugin writing verbrpc stubs (<name>.vrpc.h/.c).
 * protoc sends a CodeGeneratorRequest on stdin and reads a
 * CodeGeneratorResponse from stdout. With the option protoc_c=PATH it also
 * runs protoc-c's plugin (PATH, e.g. /usr/bin/protoc-gen-c) on the same
 * request, after our checks and with C keywords escaped, and returns its
 * <name>.pb-c.h/.c too: that is how verbrpc_generate() drives it, so that
 * unsupported input gets our clear error instead of protoc-c's. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <verbrpc/version.h>

#include "gen.h"

typedef Google__Protobuf__Compiler__CodeGeneratorRequest Request;
typedef Google__Protobuf__Compiler__CodeGeneratorResponse Response;
typedef Google__Protobuf__Compiler__CodeGeneratorResponse__File ResponseFile;

static int read_all(int fd, uint8_t **data, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = xmalloc(cap);

    for (;;) {
        ssize_t r;

        if (n == cap)
            buf = xrealloc(buf, cap *= 2);
        r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            return -e;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    *data = buf;
    *len = n;
    return 0;
}

static int write_all(int fd, const uint8_t *data, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, data, len);

        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        data += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Runs protoc-c's plugin on req (already escaped) and returns its response,
 * or NULL with a reason in *err. The request goes through an unlinked temp
 * file, so that a large request and a large response cannot deadlock on pipes. */
static Response *run_protoc_c(const char *path, const Request *req, char **err)
{
    size_t n = google__protobuf__compiler__code_generator_request__get_packed_size(req);
    uint8_t *buf = xmalloc(n);
    FILE *in = tmpfile();
    int out[2] = {-1, -1}, status;
    uint8_t *resp_data = NULL;
    size_t resp_len = 0;
    Response *resp = NULL;
    pid_t pid;
    char msg[512];

    google__protobuf__compiler__code_generator_request__pack(req, buf);
    if (!in || write_all(fileno(in), buf, n) != 0 || lseek(fileno(in), 0, SEEK_SET) != 0) {
        snprintf(msg, sizeof(msg), "cannot write a temporary file for %s: %s", path, strerror(errno));
        goto fail;
    }
    if (pipe(out) != 0) {
        snprintf(msg, sizeof(msg), "pipe: %s", strerror(errno));
        goto fail;
    }
    pid = fork();
    if (pid < 0) {
        snprintf(msg, sizeof(msg), "fork: %s", strerror(errno));
        goto fail;
    }
    if (pid == 0) {
        dup2(fileno(in), 0);
        dup2(out[1], 1);
        close(out[0]);
        close(out[1]);
        execl(path, path, (char *)NULL);
        fprintf(stderr, "protoc-gen-verbrpc: cannot run %s: %s\n", path, strerror(errno));
        _exit(127);
    }
    close(out[1]);
    out[1] = -1;
    if (read_all(out[0], &resp_data, &resp_len) != 0)
        resp_len = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(msg, sizeof(msg), "%s (protobuf-c's generator) failed with status %d", path,
                 WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
        goto fail;
    }
    resp = google__protobuf__compiler__code_generator_response__unpack(NULL, resp_len, resp_data);
    if (!resp) {
        snprintf(msg, sizeof(msg), "%s returned an unreadable response", path);
        goto fail;
    }
    free(resp_data);
    free(buf);
    fclose(in);
    close(out[0]);
    return resp;
fail:
    *err = xstrdup(msg);
    free(resp_data);
    free(buf);
    if (in)
        fclose(in);
    if (out[0] >= 0)
        close(out[0]);
    if (out[1] >= 0)
        close(out[1]);
    return NULL;
}

/* Run from a shell (any argument): --version, --help, or the usage on
 * stderr. The exit status. */
static int command_line(int argc, char **argv)
{
    bool help = !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h");
    if (argc == 2 && !strcmp(argv[1], "--version")) {
        printf("protoc-gen-verbrpc %s\n", VRPC_VERSION_STRING);
        return 0;
    }
    fprintf(help && argc == 2 ? stdout : stderr,
            "usage: protoc --plugin=protoc-gen-verbrpc=%s --verbrpc_out=[OPTIONS:]DIR FILE.proto...\n"
            "  a protoc plugin (it reads protoc's request on stdin); OPTIONS: protoc_c=PATH\n"
            "  (also run protoc-c's plugin), export_macro=NAME (put NAME before generated\n"
            "  declarations). The framework's own .proto files are in\n"
            "  PREFIX/share/verbrpc/proto (-I there, import \"verbrpc/health.proto\").\n"
            "  %s --version prints the version, --help this text.\n",
            argv[0], argv[0]);
    return help && argc == 2 ? 0 : 2;
}

/* protoc's request from stdin; NULL (said on stderr) if there is none. */
static Request *read_request(void)
{
    uint8_t *data;
    size_t len;
    Request *req;
    int rc = read_all(0, &data, &len);

    if (rc != 0) {
        fprintf(stderr, "protoc-gen-verbrpc: reading stdin: %s\n", strerror(-rc));
        return NULL;
    }
    req = google__protobuf__compiler__code_generator_request__unpack(NULL, len, data);
    free(data);
    if (!req)
        fprintf(stderr, "protoc-gen-verbrpc: stdin is not a CodeGeneratorRequest (run me from protoc)\n");
    return req;
}

/* What the response points at, freed once it is written. */
struct run {
    struct gen_output out;
    struct gen_options opt;
    Response *c_resp;
    char *protoc_c, *err;
    ResponseFile *files, **file_ptrs;
};

/* The response's files: ours, then protoc-c's. */
static void attach_files(struct run *r, Response *resp)
{
    size_t n_files = r->out.n_files + (r->c_resp ? r->c_resp->n_file : 0);

    r->files = xmalloc((n_files ? n_files : 1) * sizeof(*r->files));
    r->file_ptrs = xmalloc((n_files ? n_files : 1) * sizeof(*r->file_ptrs));
    for (size_t i = 0; i < r->out.n_files; i++) {
        google__protobuf__compiler__code_generator_response__file__init(&r->files[i]);
        r->files[i].name = r->out.files[i].name;
        r->files[i].content = r->out.files[i].content;
        r->file_ptrs[i] = &r->files[i];
    }
    for (size_t i = 0; r->c_resp && i < r->c_resp->n_file; i++)
        r->file_ptrs[r->out.n_files + i] = r->c_resp->file[i];
    resp->n_file = n_files;
    resp->file = r->file_ptrs;
}

/* Fills resp for req: the generated files (and protoc-c's), or the error. */
static void generate(Request *req, struct run *r, Response *resp)
{
    if (!gen_parse_parameter(req->parameter, &r->opt, &r->protoc_c, &r->err)) {
        resp->error = r->err;
        return;
    }
    gen_run(req, &r->opt, &r->out);
    if (r->out.errors.len) {
        /* protoc prints it after "--verbrpc_out: "; drop the final newline. */
        r->out.errors.data[--r->out.errors.len] = '\0';
        resp->error = r->out.errors.data;
        return;
    }
    if (r->protoc_c) {
        gen_escape_for_protoc_c(req);
        free(req->parameter); /* our options mean nothing to protoc-c */
        req->parameter = NULL;
        r->c_resp = run_protoc_c(r->protoc_c, req, &r->err);
        if (!r->c_resp) {
            resp->error = r->err;
            return;
        }
        if (r->c_resp->error) {
            resp->error = r->c_resp->error;
            return;
        }
    }
    attach_files(r, resp);
}

/* Writes resp to stdout: 0 or a negative errno (said on stderr). */
static int respond(const Response *resp)
{
    size_t n_packed = google__protobuf__compiler__code_generator_response__get_packed_size(resp);
    uint8_t *packed = xmalloc(n_packed);
    int rc;

    google__protobuf__compiler__code_generator_response__pack(resp, packed);
    rc = write_all(1, packed, n_packed);
    if (rc != 0)
        fprintf(stderr, "protoc-gen-verbrpc: writing stdout: %s\n", strerror(-rc));
    free(packed);
    return rc;
}

static void run_free(struct run *r)
{
    free(r->files);
    free(r->file_ptrs);
    free(r->err);
    free(r->protoc_c);
    free((char *)r->opt.export_macro);
    if (r->c_resp)
        google__protobuf__compiler__code_generator_response__free_unpacked(r->c_resp, NULL);
    gen_output_free(&r->out);
}

int main(int argc, char **argv)
{
    Response resp = GOOGLE__PROTOBUF__COMPILER__CODE_GENERATOR_RESPONSE__INIT;
    struct run r = {0};
    Request *req;
    int rc;

    if (argc > 1)
        return command_line(argc, argv);
    if (!(req = read_request()))
        return 1;
    /* We accept proto3 `optional` at protoc's level so that the check below,
     * not protoc, explains why such files cannot be used with protoc-c. */
    resp.has_supported_features = 1;
    resp.supported_features = GOOGLE__PROTOBUF__COMPILER__CODE_GENERATOR_RESPONSE__FEATURE__FEATURE_PROTO3_OPTIONAL;
    generate(req, &r, &resp);
    rc = respond(&resp);
    run_free(&r);
    google__protobuf__compiler__code_generator_request__free_unpacked(req, NULL);
    return rc == 0 ? 0 : 1;
}
