/* The reflection service (verbrpc.reflection.v1.Reflection): the services a
 * server has methods of, and the .proto descriptors protoc-gen-verbrpc
 * embedded in the generated code of those methods (vrpc_method_desc.file and
 * its deps). Files are told apart by name: every generated .vrpc.c embeds
 * its own copy of the files it imports. Not a hot path: it mallocs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <verbrpc/reflection.vrpc.h>

#include "builtins.h"

struct fileset {
    const struct vrpc_file_desc **v;
    size_t n, cap;
};

static bool fileset_has(const struct fileset *fs, const struct vrpc_file_desc *f)
{
    for (size_t i = 0; i < fs->n; i++)
        if (fs->v[i] == f || strcmp(fs->v[i]->name, f->name) == 0)
            return true;
    return false;
}

/* Adds f and, after it, everything it imports (transitively), each name once. */
static int fileset_add(struct fileset *fs, const struct vrpc_file_desc *f)
{
    if (!f || fileset_has(fs, f))
        return 0;
    if (fs->n == fs->cap) {
        size_t cap = fs->cap ? 2 * fs->cap : 16;
        const struct vrpc_file_desc **v = realloc(fs->v, cap * sizeof(*v));

        if (!v)
            return -ENOMEM;
        fs->v = v;
        fs->cap = cap;
    }
    fs->v[fs->n++] = f;
    for (size_t i = 0; i < f->n_deps; i++) {
        int rc = fileset_add(fs, f->deps[i]);

        if (rc)
            return rc;
    }
    return 0;
}

/* Every file the server's methods come from, with their imports. */
static int served_files(struct vrpc_server_call *call, const struct vrpc_server *s, struct fileset *fs)
{
    struct vrpc_method_stats *v;
    size_t n;
    int rc = vrpc_builtins_snapshot(call, s, &v, &n);

    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = fileset_add(fs, v[i].method->file);
    return rc;
}

static bool declares(const struct vrpc_file_desc *f, const char *symbol)
{
    for (size_t i = 0; i < f->n_symbols; i++)
        if (strcmp(f->symbols[i], symbol) == 0)
            return true;
    return false;
}

/* Answers with f and its imports, or NOT_FOUND naming what was asked. */
static void respond_files(struct vrpc_server_call *call, const struct vrpc_file_desc *f, const char *what,
                          const char *name)
{
    Verbrpc__Reflection__V1__FileDescriptorResponse resp = VERBRPC__REFLECTION__V1__FILE_DESCRIPTOR_RESPONSE__INIT;
    struct fileset out = {0};
    ProtobufCBinaryData *b = NULL;
    char msg[VRPC_STATUS_MSG_MAX];

    if (!f) {
        snprintf(msg, sizeof(msg), "reflection: no %s '%s' on this server", what, name);
        vrpc_server_call_fail(call, VRPC_NOT_FOUND, msg);
        return;
    }
    if (fileset_add(&out, f) != 0 || !(b = vrpc_server_call_alloc(call, out.n * sizeof(*b)))) {
        free(out.v);
        vrpc_server_call_fail(call, VRPC_RESOURCE_EXHAUSTED, "reflection: out of memory");
        return;
    }
    for (size_t i = 0; i < out.n; i++) {
        b[i].data = (uint8_t *)(uintptr_t)out.v[i]->data; /* only read: packed before respond returns */
        b[i].len = out.v[i]->len;
    }
    resp.n_file_descriptor_proto = out.n;
    resp.file_descriptor_proto = b;
    free(out.v);
    verbrpc__reflection__v1__reflection__file_containing_symbol__respond(call, &resp);
}

static void lookup(struct vrpc_server_call *call, void *server, const char *key, bool by_symbol)
{
    struct fileset fs = {0};
    const struct vrpc_file_desc *found = NULL;

    if (served_files(call, server, &fs) != 0) {
        free(fs.v);
        vrpc_server_call_fail(call, VRPC_RESOURCE_EXHAUSTED, "reflection: out of memory");
        return;
    }
    for (size_t i = 0; i < fs.n && !found; i++)
        if (by_symbol ? declares(fs.v[i], key) : strcmp(fs.v[i]->name, key) == 0)
            found = fs.v[i];
    free(fs.v);
    respond_files(call, found, by_symbol ? "symbol" : "file", key);
}

static void file_containing_symbol(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *server)
{
    const Verbrpc__Reflection__V1__FileContainingSymbolRequest *req =
        (const Verbrpc__Reflection__V1__FileContainingSymbolRequest *)msg;

    lookup(call, server, req->symbol ? req->symbol : "", true);
}

static void file_by_filename(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *server)
{
    const Verbrpc__Reflection__V1__FileByFilenameRequest *req =
        (const Verbrpc__Reflection__V1__FileByFilenameRequest *)msg;

    lookup(call, server, req->filename ? req->filename : "", false);
}

static void list_services(struct vrpc_server_call *call, const ProtobufCMessage *msg, void *server)
{
    Verbrpc__Reflection__V1__ListServicesResponse resp = VERBRPC__REFLECTION__V1__LIST_SERVICES_RESPONSE__INIT;
    struct vrpc_method_stats *v;
    size_t n;
    char **names;

    (void)msg;
    if (vrpc_builtins_snapshot(call, server, &v, &n) != 0 ||
        !(names = vrpc_server_call_alloc(call, (n ? n : 1) * sizeof(*names)))) {
        vrpc_server_call_fail(call, VRPC_RESOURCE_EXHAUSTED, "reflection: out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        /* "/pkg.Service/Method" -> "pkg.Service" */
        const char *full = v[i].method->full_name + 1, *slash = strchr(full, '/');
        size_t len = slash ? (size_t)(slash - full) : strlen(full), k;
        char *name;

        for (k = 0; k < resp.n_services && !(strncmp(names[k], full, len) == 0 && names[k][len] == '\0'); k++)
            ;
        if (k < resp.n_services)
            continue;
        if (!(name = vrpc_server_call_alloc(call, len + 1))) {
            vrpc_server_call_fail(call, VRPC_RESOURCE_EXHAUSTED, "reflection: out of memory");
            return;
        }
        memcpy(name, full, len);
        name[len] = '\0';
        names[resp.n_services++] = name;
    }
    resp.services = names;
    verbrpc__reflection__v1__reflection__list_services__respond(call, &resp);
}

int vrpc_reflection_register(struct vrpc_server *s)
{
    /* As the other built-ins: the server is the handlers' user pointer. */
    int rc = vrpc_server_register(s, &verbrpc__reflection__v1__reflection__list_services__method, list_services, s);

    if (rc == 0)
        rc = vrpc_server_register(s, &verbrpc__reflection__v1__reflection__file_containing_symbol__method,
                                  file_containing_symbol, s);
    if (rc == 0)
        rc = vrpc_server_register(s, &verbrpc__reflection__v1__reflection__file_by_filename__method, file_by_filename,
                                  s);
    return rc;
}
