/* strbuf: a growable text buffer for the generator (protoc-gen-verbrpc).
 * The generator is a short-lived batch program: on allocation failure it
 * prints a message and exits, so callers never check for errors. */
#ifndef VRPC_CODEGEN_STRBUF_H
#define VRPC_CODEGEN_STRBUF_H

#include <stddef.h>

struct strbuf {
    char *data; /* always NUL-terminated once anything was appended */
    size_t len;
    size_t cap;
};

#define STRBUF_INIT                                                                                                    \
    {                                                                                                                  \
        NULL, 0, 0                                                                                                     \
    }

void sb_append(struct strbuf *sb, const char *s);
void sb_appendn(struct strbuf *sb, const char *s, size_t n);
void sb_appendc(struct strbuf *sb, char c);
void sb_printf(struct strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Returns the buffer's text (never NULL) and hands ownership to the caller;
 * the strbuf is left empty. */
char *sb_steal(struct strbuf *sb);
void sb_free(struct strbuf *sb);

/* Out-of-memory exit, shared by all generator code. */
void *xmalloc(size_t n);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

#endif
