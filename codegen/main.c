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
    int out[2] = { -1, -1 }, status;
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

int main(int argc, char **argv)
{
    Response resp = GOOGLE__PROTOBUF__COMPILER__CODE_GENERATOR_RESPONSE__INIT;
    struct gen_output out = { 0 };
    struct gen_options opt = { 0 };
    Response *c_resp = NULL;
    char *protoc_c = NULL, *err = NULL;
    uint8_t *data, *packed;
    size_t len, n_packed;
    Request *req;
    ResponseFile *files = NULL, **file_ptrs = NULL;
    size_t n_files = 0;
    int rc;

    if (argc > 1) {
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
    rc = read_all(0, &data, &len);
    if (rc != 0) {
        fprintf(stderr, "protoc-gen-verbrpc: reading stdin: %s\n", strerror(-rc));
        return 1;
    }
    req = google__protobuf__compiler__code_generator_request__unpack(NULL, len, data);
    free(data);
    if (!req) {
        fprintf(stderr, "protoc-gen-verbrpc: stdin is not a CodeGeneratorRequest (run me from protoc)\n");
        return 1;
    }

    /* We accept proto3 `optional` at protoc's level so that the check below,
     * not protoc, explains why such files cannot be used with protoc-c. */
    resp.has_supported_features = 1;
    resp.supported_features = GOOGLE__PROTOBUF__COMPILER__CODE_GENERATOR_RESPONSE__FEATURE__FEATURE_PROTO3_OPTIONAL;

    if (!gen_parse_parameter(req->parameter, &opt, &protoc_c, &err)) {
        resp.error = err;
        goto respond;
    }
    gen_run(req, &opt, &out);
    if (out.errors.len) {
        /* protoc prints it after "--verbrpc_out: "; drop the final newline. */
        out.errors.data[--out.errors.len] = '\0';
        resp.error = out.errors.data;
        goto respond;
    }
    if (protoc_c) {
        gen_escape_for_protoc_c(req);
        free(req->parameter); /* our options mean nothing to protoc-c */
        req->parameter = NULL;
        c_resp = run_protoc_c(protoc_c, req, &err);
        if (!c_resp) {
            resp.error = err;
            goto respond;
        }
        if (c_resp->error) {
            resp.error = c_resp->error;
            goto respond;
        }
    }

    n_files = out.n_files + (c_resp ? c_resp->n_file : 0);
    files = xmalloc((n_files ? n_files : 1) * sizeof(*files));
    file_ptrs = xmalloc((n_files ? n_files : 1) * sizeof(*file_ptrs));
    for (size_t i = 0; i < out.n_files; i++) {
        google__protobuf__compiler__code_generator_response__file__init(&files[i]);
        files[i].name = out.files[i].name;
        files[i].content = out.files[i].content;
        file_ptrs[i] = &files[i];
    }
    for (size_t i = 0; c_resp && i < c_resp->n_file; i++)
        file_ptrs[out.n_files + i] = c_resp->file[i];
    resp.n_file = n_files;
    resp.file = file_ptrs;

respond:
    n_packed = google__protobuf__compiler__code_generator_response__get_packed_size(&resp);
    packed = xmalloc(n_packed);
    google__protobuf__compiler__code_generator_response__pack(&resp, packed);
    rc = write_all(1, packed, n_packed);
    if (rc != 0)
        fprintf(stderr, "protoc-gen-verbrpc: writing stdout: %s\n", strerror(-rc));
    free(packed);
    free(files);
    free(file_ptrs);
    free(err);
    free(protoc_c);
    free((char *)opt.export_macro);
    if (c_resp)
        google__protobuf__compiler__code_generator_response__free_unpacked(c_resp, NULL);
    gen_output_free(&out);
    google__protobuf__compiler__code_generator_request__free_unpacked(req, NULL);
    return rc == 0 ? 0 : 1;
}
