/* descpool: a flat index (name -> descriptor) over the files added, built as
 * each file arrives. */
#include "descpool.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void descpool_init(struct descpool *p) { memset(p, 0, sizeof(*p)); }

void descpool_free(struct descpool *p)
{
    for (size_t i = 0; i < p->n_files; i++)
        google__protobuf__file_descriptor_proto__free_unpacked(p->files[i], NULL);
    for (size_t i = 0; i < p->n_syms; i++)
        free(p->syms[i].full);
    free(p->files);
    free(p->syms);
    memset(p, 0, sizeof(*p));
}

static int add_sym(struct descpool *p, const char *prefix, const char *name, enum dp_kind kind, const void *d,
                   const DpFile *f)
{
    size_t len = (prefix && *prefix ? strlen(prefix) + 1 : 0) + strlen(name) + 1;
    char *full = malloc(len);

    if (!full)
        return -ENOMEM;
    if (prefix && *prefix)
        snprintf(full, len, "%s.%s", prefix, name);
    else
        snprintf(full, len, "%s", name);
    if (p->n_syms == p->cap_syms) {
        size_t cap = p->cap_syms ? 2 * p->cap_syms : 64;
        struct dp_sym *v = realloc(p->syms, cap * sizeof(*v));

        if (!v) {
            free(full);
            return -ENOMEM;
        }
        p->syms = v;
        p->cap_syms = cap;
    }
    p->syms[p->n_syms++] = (struct dp_sym){.full = full, .kind = kind, .d = d, .file = f};
    return 0;
}

static int add_msgs(struct descpool *p, const DpFile *f, const char *prefix, DpMsg *const *msgs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int rc = add_sym(p, prefix, msgs[i]->name, DP_MESSAGE, msgs[i], f);
        const char *full;

        if (rc)
            return rc;
        full = p->syms[p->n_syms - 1].full;
        for (size_t e = 0; e < msgs[i]->n_enum_type && rc == 0; e++)
            rc = add_sym(p, full, msgs[i]->enum_type[e]->name, DP_ENUM, msgs[i]->enum_type[e], f);
        if (rc == 0)
            rc = add_msgs(p, f, full, msgs[i]->nested_type, msgs[i]->n_nested_type); /* full: its own malloc */
        if (rc)
            return rc;
    }
    return 0;
}

bool descpool_has_file(const struct descpool *p, const char *name)
{
    for (size_t i = 0; i < p->n_files; i++)
        if (strcmp(p->files[i]->name, name) == 0)
            return true;
    return false;
}

int descpool_add(struct descpool *p, const uint8_t *data, size_t len)
{
    DpFile *f = google__protobuf__file_descriptor_proto__unpack(NULL, len, data);
    DpFile **v;
    int rc = 0;

    if (!f || !f->name)
        goto bad;
    if (descpool_has_file(p, f->name)) {
        google__protobuf__file_descriptor_proto__free_unpacked(f, NULL);
        return 0;
    }
    v = realloc(p->files, (p->n_files + 1) * sizeof(*v));
    if (!v) {
        google__protobuf__file_descriptor_proto__free_unpacked(f, NULL);
        return -ENOMEM;
    }
    p->files = v;
    p->files[p->n_files++] = f;
    rc = add_msgs(p, f, f->package, f->message_type, f->n_message_type);
    for (size_t e = 0; e < f->n_enum_type && rc == 0; e++)
        rc = add_sym(p, f->package, f->enum_type[e]->name, DP_ENUM, f->enum_type[e], f);
    for (size_t s = 0; s < f->n_service && rc == 0; s++)
        rc = add_sym(p, f->package, f->service[s]->name, DP_SERVICE, f->service[s], f);
    return rc;
bad:
    if (f)
        google__protobuf__file_descriptor_proto__free_unpacked(f, NULL);
    return -EBADMSG;
}

int descpool_load_set(struct descpool *p, const char *path)
{
    FILE *fp = fopen(path, "rb");
    uint8_t *buf = NULL;
    long size = 0;
    int rc = 0;
    Google__Protobuf__FileDescriptorSet *set;

    if (!fp)
        return -errno;
    if (fseek(fp, 0, SEEK_END) != 0 || (size = ftell(fp)) < 0 || fseek(fp, 0, SEEK_SET) != 0)
        rc = -errno;
    else if (!(buf = malloc((size_t)size + 1)))
        rc = -ENOMEM;
    else if (fread(buf, 1, (size_t)size, fp) != (size_t)size)
        rc = -EIO;
    fclose(fp);
    if (rc) {
        free(buf);
        return rc;
    }
    set = google__protobuf__file_descriptor_set__unpack(NULL, (size_t)size, buf);
    free(buf);
    if (!set)
        return -EBADMSG;
    for (size_t i = 0; i < set->n_file && rc == 0; i++) {
        size_t len = google__protobuf__file_descriptor_proto__get_packed_size(set->file[i]);
        uint8_t *b = malloc(len ? len : 1);

        if (!b) {
            rc = -ENOMEM;
            break;
        }
        google__protobuf__file_descriptor_proto__pack(set->file[i], b);
        rc = descpool_add(p, b, len);
        free(b);
    }
    google__protobuf__file_descriptor_set__free_unpacked(set, NULL);
    return rc;
}

const struct dp_sym *descpool_find(const struct descpool *p, const char *name)
{
    if (name[0] == '.')
        name++;
    for (size_t i = 0; i < p->n_syms; i++)
        if (strcmp(p->syms[i].full, name) == 0)
            return &p->syms[i];
    return NULL;
}

const DpMsg *descpool_message(const struct descpool *p, const char *name, const DpFile **file)
{
    const struct dp_sym *s = descpool_find(p, name);

    if (!s || s->kind != DP_MESSAGE)
        return NULL;
    if (file)
        *file = s->file;
    return s->d;
}

const DpEnum *descpool_enum(const struct descpool *p, const char *name)
{
    const struct dp_sym *s = descpool_find(p, name);

    return s && s->kind == DP_ENUM ? s->d : NULL;
}

bool descpool_method(const struct descpool *p, const char *name, const struct dp_sym **svc, const DpMethod **m)
{
    char buf[512];
    const char *sep;
    const struct dp_sym *s;

    if (name[0] == '/')
        name++;
    sep = strrchr(name, '/');
    if (!sep)
        sep = strrchr(name, '.');
    if (!sep || (size_t)(sep - name) >= sizeof(buf))
        return false;
    memcpy(buf, name, (size_t)(sep - name));
    buf[sep - name] = '\0';
    s = descpool_find(p, buf);
    if (!s || s->kind != DP_SERVICE)
        return false;
    const DpService *sd = s->d;
    for (size_t i = 0; i < sd->n_method; i++) {
        if (strcmp(sd->method[i]->name, sep + 1) == 0) {
            *svc = s;
            *m = sd->method[i];
            return true;
        }
    }
    return false;
}

bool dp_proto3(const DpFile *f) { return f && f->syntax && strcmp(f->syntax, "proto3") == 0; }
