/* names: protoc-c's C naming rules and the method-id hash (see names.h).
 * Character classes are ASCII on purpose: protoc-c calls isupper()/tolower()
 * in the C locale, and .proto identifiers are ASCII letters, digits and '_'. */
#include "names.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strbuf.h"

static bool is_upper(char c) { return c >= 'A' && c <= 'Z'; }
static bool is_lower(char c) { return c >= 'a' && c <= 'z'; }
static bool is_alnum(char c) { return is_upper(c) || is_lower(c) || (c >= '0' && c <= '9'); }
static char to_lower(char c) { return is_upper(c) ? (char)(c - 'A' + 'a') : c; }
static char to_upper(char c) { return is_lower(c) ? (char)(c - 'a' + 'A') : c; }

static char *camel_to(const char *name, bool upper)
{
    struct strbuf sb = STRBUF_INIT;
    bool was_upper = true; /* no '_' before a leading capital */

    for (const char *p = name; *p; p++) {
        bool up = is_upper(*p);

        if (up && !was_upper)
            sb_appendc(&sb, '_');
        sb_appendc(&sb, upper ? to_upper(*p) : to_lower(*p));
        was_upper = up;
    }
    return sb_steal(&sb);
}

char *pc_camel_to_lower(const char *name) { return camel_to(name, false); }
char *pc_camel_to_upper(const char *name) { return camel_to(name, true); }

char *pc_to_camel(const char *name)
{
    struct strbuf sb = STRBUF_INIT;
    bool next_upper = true;

    for (const char *p = name; *p; p++) {
        if (*p == '_') {
            next_upper = true;
        } else if (next_upper) {
            sb_appendc(&sb, to_upper(*p));
            next_upper = false;
        } else {
            sb_appendc(&sb, *p);
        }
    }
    return sb_steal(&sb);
}

static char *full_name_to(const char *dotted, char *(*piece_fn)(const char *))
{
    struct strbuf sb = STRBUF_INIT;
    const char *p = dotted;

    while (*p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);

        if (n > 0) {
            char *piece = xmalloc(n + 1);
            memcpy(piece, p, n);
            piece[n] = '\0';
            char *conv = piece_fn(piece);
            if (sb.len)
                sb_append(&sb, "__");
            sb_append(&sb, conv);
            free(conv);
            free(piece);
        }
        p += n;
        if (*p == '.')
            p++;
    }
    return sb_steal(&sb);
}

char *pc_full_name_to_c(const char *dotted) { return full_name_to(dotted, pc_to_camel); }
char *pc_full_name_to_lower(const char *dotted) { return full_name_to(dotted, pc_camel_to_lower); }
char *pc_full_name_to_upper(const char *dotted) { return full_name_to(dotted, pc_camel_to_upper); }

char *pc_filename_identifier(const char *filename)
{
    struct strbuf sb = STRBUF_INIT;

    for (const char *p = filename; *p; p++) {
        if (is_alnum(*p))
            sb_appendc(&sb, *p);
        else
            sb_printf(&sb, "_%x", (unsigned)(unsigned char)*p);
    }
    return sb_steal(&sb);
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);

    return n >= m && strcmp(s + n - m, suffix) == 0;
}

char *pc_strip_proto(const char *filename)
{
    char *s = xstrdup(filename);

    if (has_suffix(s, ".protodevel"))
        s[strlen(s) - strlen(".protodevel")] = '\0';
    else if (has_suffix(s, ".proto"))
        s[strlen(s) - strlen(".proto")] = '\0';
    return s;
}

/* C11 keywords, protoc-c's C++ keyword list, and names that standard headers
 * included by generated code define as macros (bool/true/false from
 * stdbool.h, assert, errno...), which would break a member declaration. */
static const char *const keywords[] = {
    "_Alignas",
    "_Alignof",
    "_Atomic",
    "_Bool",
    "_Complex",
    "_Generic",
    "_Imaginary",
    "_Noreturn",
    "_Static_assert",
    "_Thread_local",
    "alignas",
    "alignof",
    "and",
    "and_eq",
    "asm",
    "assert",
    "auto",
    "bitand",
    "bitor",
    "bool",
    "break",
    "case",
    "catch",
    "char",
    "char16_t",
    "char32_t",
    "class",
    "compl",
    "complex",
    "const",
    "const_cast",
    "constexpr",
    "continue",
    "decltype",
    "default",
    "delete",
    "do",
    "double",
    "dynamic_cast",
    "else",
    "enum",
    "errno",
    "explicit",
    "export",
    "extern",
    "false",
    "float",
    "for",
    "friend",
    "goto",
    "if",
    "imaginary",
    "inline",
    "int",
    "long",
    "mutable",
    "namespace",
    "new",
    "noexcept",
    "noreturn",
    "not",
    "not_eq",
    "nullptr",
    "offsetof",
    "operator",
    "or",
    "or_eq",
    "private",
    "protected",
    "public",
    "register",
    "reinterpret_cast",
    "restrict",
    "return",
    "short",
    "signed",
    "sizeof",
    "static",
    "static_assert",
    "static_cast",
    "struct",
    "switch",
    "template",
    "this",
    "thread_local",
    "throw",
    "true",
    "try",
    "typedef",
    "typeid",
    "typename",
    "union",
    "unsigned",
    "using",
    "virtual",
    "void",
    "volatile",
    "wchar_t",
    "while",
    "xor",
    "xor_eq",
};

bool c_is_keyword(const char *s)
{
    for (size_t i = 0; i < sizeof(keywords) / sizeof(keywords[0]); i++)
        if (strcmp(s, keywords[i]) == 0)
            return true;
    return false;
}

uint32_t vrpc_fnv1a32(const char *s)
{
    uint32_t h = 2166136261u;

    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        h ^= *p;
        h *= 16777619u;
    }
    return h;
}
