/* gen_check: what protoc-gen-verbrpc refuses before writing anything
 * (proto3 `optional`, clashing C names and method ids, unknown types),
 * each reported with the file, the line and column protoc recorded, and the
 * reason. */
#include "gen_priv.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "names.h"

/* A C identifier the generated code declares, remembered to detect clashes. */
struct ident {
    char *name;
    char *what; /* "method demo.v1.Echo.Say" */
    int32_t path[4];
    size_t n_path;
};

struct idents {
    struct ident *v;
    size_t n, cap;
};

/* ---- diagnostics --------------------------------------------------------- */

static void diag(struct gen_output *out, const FileProto *f, const int32_t *path, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void diag(struct gen_output *out, const FileProto *f, const int32_t *path, size_t n, const char *fmt, ...)
{
    const Google__Protobuf__SourceCodeInfo__Location *l = path ? gen_find_location(f, path, n) : NULL;
    va_list ap;
    int len;

    if (l && l->n_span >= 2)
        sb_printf(&out->errors, "%s:%d:%d: ", f->name, l->span[0] + 1, l->span[1] + 1);
    else
        sb_printf(&out->errors, "%s: ", f->name);
    va_start(ap, fmt);
    len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (len > 0) {
        char *msg = xmalloc((size_t)len + 1);
        va_start(ap, fmt);
        vsnprintf(msg, (size_t)len + 1, fmt, ap);
        va_end(ap);
        sb_append(&out->errors, msg);
        free(msg);
    }
    sb_appendc(&out->errors, '\n');
}

static int line_of(const FileProto *f, const int32_t *path, size_t n)
{
    const Google__Protobuf__SourceCodeInfo__Location *l = gen_find_location(f, path, n);

    return l && l->n_span >= 1 ? l->span[0] + 1 : 0;
}

/* ---- checks -------------------------------------------------------------- */

/* proto3 `optional` fields: protoc-c 1.4.1 refuses them with a message about
 * "code generator protoc-gen-c hasn't been updated"; say what is going on. */
static void check_optional(struct gen_output *out, const FileProto *f, MsgProto *const *msgs, size_t n, int32_t *path,
                           size_t depth, const char *prefix)
{
    for (size_t i = 0; i < n; i++) {
        const MsgProto *m = msgs[i];
        char *name = prefix ? gen_str_printf("%s.%s", prefix, m->name) : xstrdup(m->name);

        if (depth + 4 > MAX_PATH) {
            free(name);
            continue;
        }
        path[depth] = (int32_t)i;
        for (size_t j = 0; j < m->n_field; j++) {
            const FieldProto *fd = m->field[j];

            if (fd->has_proto3_optional && fd->proto3_optional) {
                path[depth + 1] = MSG_FIELD;
                path[depth + 2] = (int32_t)j;
                diag(out, f, path, depth + 3,
                     "field '%s' of message '%s' is a proto3 'optional' field, which protoc-c 1.4.1 "
                     "(the protobuf-c generator verbrpc builds on) cannot compile; drop 'optional' "
                     "(a scalar then has no presence), wrap the value in a message such as "
                     "google.protobuf.Int32Value, or use a oneof",
                     fd->name, name);
            }
        }
        path[depth + 1] = MSG_NESTED_TYPE;
        check_optional(out, f, m->nested_type, m->n_nested_type, path, depth + 2, name);
        free(name);
    }
}

static void idents_add(struct idents *ids, char *name, char *what, const int32_t *path, size_t n_path)
{
    struct ident *id;

    if (ids->n == ids->cap) {
        ids->cap = ids->cap ? ids->cap * 2 : 32;
        ids->v = xrealloc(ids->v, ids->cap * sizeof(*ids->v));
    }
    id = &ids->v[ids->n++];
    id->name = name;
    id->what = what;
    memcpy(id->path, path, n_path * sizeof(*path));
    id->n_path = n_path;
}

static void idents_free(struct idents *ids)
{
    for (size_t i = 0; i < ids->n; i++) {
        free(ids->v[i].name);
        free(ids->v[i].what);
    }
    free(ids->v);
    ids->v = NULL;
    ids->n = ids->cap = 0;
}

static void check_clashes(struct gen_output *out, const FileProto *f, const struct idents *ids)
{
    for (size_t i = 1; i < ids->n; i++) {
        for (size_t j = 0; j < i; j++) {
            bool seen = false;

            if (strcmp(ids->v[i].name, ids->v[j].name) != 0)
                continue;
            /* One report per pair of clashing elements, not per C name. */
            for (size_t k = 1; k < i && !seen; k++)
                for (size_t l = 0; l < k && !seen; l++)
                    seen = strcmp(ids->v[k].what, ids->v[i].what) == 0 && strcmp(ids->v[l].what, ids->v[j].what) == 0 &&
                           strcmp(ids->v[k].name, ids->v[l].name) == 0;
            if (!seen)
                diag(out, f, ids->v[i].path, ids->v[i].n_path,
                     "%s gets the C name '%s', which %s (line %d) also gets; rename one of them", ids->v[i].what,
                     ids->v[i].name, ids->v[j].what, line_of(f, ids->v[j].path, ids->v[j].n_path));
            break;
        }
    }
}

void gen_check_file(struct gen_output *out, const FileProto *f, const struct symtab *st)
{
    int32_t path[MAX_PATH];
    struct idents ids = {0};
    struct {
        char *full;
        int32_t path[4];
    } *ids_full = NULL;
    size_t n_ids_full = 0, cap_ids_full = 0;

    path[0] = FILE_MESSAGE_TYPE;
    check_optional(out, f, f->message_type, f->n_message_type, path, 1, NULL);

    for (size_t si = 0; si < f->n_service; si++) {
        const SvcProto *s = f->service[si];
        struct svc_names sn;
        int32_t spath[2] = {FILE_SERVICE, (int32_t)si};

        gen_svc_names_init(&sn, f, s);
        idents_add(&ids, gen_str_printf("%s_VrpcImpl", sn.c_type), gen_str_printf("service %s", sn.full), spath, 2);
        idents_add(&ids, gen_str_printf("%s__vrpc_register", sn.lower), gen_str_printf("service %s", sn.full), spath,
                   2);
        for (size_t mi = 0; mi < s->n_method; mi++) {
            const MethodProto *m = s->method[mi];
            int32_t mpath[4] = {FILE_SERVICE, (int32_t)si, SVC_METHOD, (int32_t)mi};
            struct method_names mn;

            gen_method_names_init(&mn, &sn, m, st);
            if (!mn.in || !mn.out)
                diag(out, f, mpath, 4, "method '%s' of service '%s': type '%s' not found in the request", m->name,
                     sn.full, !mn.in ? m->input_type : m->output_type);
            idents_add(&ids, xstrdup(mn.prefix), gen_str_printf("method '%s' of service '%s'", m->name, sn.full), mpath,
                       4);
            idents_add(&ids, xstrdup(mn.done_type), gen_str_printf("method '%s' of service '%s'", m->name, sn.full),
                       mpath, 4);
            if (mn.kind != GEN_UNARY)
                idents_add(&ids, xstrdup(mn.ops_type), gen_str_printf("method '%s' of service '%s'", m->name, sn.full),
                           mpath, 4);
            /* Handler members live in the service's impl struct. */
            idents_add(&ids, gen_str_printf("%s_VrpcImpl.%s", sn.c_type, mn.member),
                       gen_str_printf("method '%s' of service '%s'", m->name, sn.full), mpath, 4);
            if (n_ids_full == cap_ids_full) {
                cap_ids_full = cap_ids_full ? cap_ids_full * 2 : 16;
                ids_full = xrealloc(ids_full, cap_ids_full * sizeof(*ids_full));
            }
            ids_full[n_ids_full].full = xstrdup(mn.full);
            memcpy(ids_full[n_ids_full].path, mpath, sizeof(mpath));
            n_ids_full++;
            gen_method_names_free(&mn);
        }
        gen_svc_names_free(&sn);
    }
    check_clashes(out, f, &ids);

    /* Method ids must be distinct within the file (FNV-1a clashes are rare
     * but possible); the core also rejects a clash between files when the
     * second method is registered. */
    for (size_t i = 0; i < n_ids_full; i++) {
        for (size_t j = 0; j < i; j++) {
            uint32_t id = vrpc_fnv1a32(ids_full[i].full);

            if (id == vrpc_fnv1a32(ids_full[j].full) && strcmp(ids_full[i].full, ids_full[j].full) != 0)
                diag(out, f, ids_full[i].path, 4,
                     "method %s has the same method id (0x%08" PRIx32 ", FNV-1a 32 of the full name) as %s; "
                     "rename one of them",
                     ids_full[i].full, id, ids_full[j].full);
        }
    }
    for (size_t i = 0; i < n_ids_full; i++)
        free(ids_full[i].full);
    free(ids_full);
    idents_free(&ids);
}
