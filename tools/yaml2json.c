/*
 * yaml2json FILE.yaml > FILE.json: the build's converter of api/openapi.yaml
 * into the JSON that GET /openapi.json serves.
 *
 * It reads the part of YAML that a hand-written OpenAPI document uses, and
 * refuses everything else with the file, the line and what to write
 * instead, so that the JSON is always the YAML's exact meaning or the build
 * stops:
 *   - block mappings and sequences (indented with spaces), comments;
 *   - block scalars: literal `|` and folded `>`, with `-`/`+` chomping;
 *   - flow collections on one line: `[1, [2, 3]]`, `{base: 10000}`, `[]`;
 *   - single- and double-quoted scalars on one line;
 *   - plain scalars, over several lines in block context.
 * Refused: anchors, aliases, tags, `?` keys, directives, several documents,
 * duplicate keys, tabs in indentation, keys that are not strings.
 *
 * Plain scalars are typed as both YAML 1.1 (PyYAML and most tools) and
 * YAML 1.2 (the core schema) type them: null (`null`, `~`, nothing), true,
 * false, integers (`-12`) and decimals with a point (`0.5`, `1.0e-3`) are
 * written as JSON's null, booleans and numbers (the number as written);
 * anything the two versions read differently, or read as something JSON has
 * not (`yes`, `on`, `1e3`, `0x1F`, `012`, `1_000`, `.inf`, `2024-01-01`,
 * `1:30`), is refused: quote it. Everything else is a string.
 *
 * Written for this project in C and libc alone (regex.h for the types), so
 * that building attnd needs nothing new.
 */
#include <errno.h>
#include <regex.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- values */

typedef enum { V_NULL, V_BOOL, V_NUMBER, V_STRING, V_SEQ, V_MAP } kind;

typedef struct value value;
struct value {
    kind kind;
    char *text;       /* V_STRING: the string; V_NUMBER: its text; V_BOOL: "true"/"false" */
    size_t len;       /* of text */
    value **items;    /* V_SEQ, V_MAP: the values */
    char **keys;      /* V_MAP: the keys */
    size_t *key_lens;
    size_t n, cap;
};

static const char *file_name;
static int error_line; /* the line an error is about (1-based), 0: none */

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (error_line)
        fprintf(stderr, "%s:%d: ", file_name, error_line);
    else
        fprintf(stderr, "%s: ", file_name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p)
        die("out of memory");
    return p;
}

static value *new_value(kind k)
{
    value *v = xrealloc(NULL, sizeof *v);
    *v = (value){.kind = k};
    return v;
}

static value *new_text(kind k, const char *s, size_t n)
{
    value *v = new_value(k);
    v->text = xrealloc(NULL, n + 1);
    memcpy(v->text, s, n);
    v->text[n] = '\0';
    v->len = n;
    return v;
}

static void append(value *c, char *key, size_t key_len, value *item)
{
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 8;
        c->items = xrealloc(c->items, c->cap * sizeof *c->items);
        if (c->kind == V_MAP) {
            c->keys = xrealloc(c->keys, c->cap * sizeof *c->keys);
            c->key_lens = xrealloc(c->key_lens, c->cap * sizeof *c->key_lens);
        }
    }
    if (c->kind == V_MAP) {
        for (size_t i = 0; i < c->n; i++)
            if (c->key_lens[i] == key_len && !memcmp(c->keys[i], key, key_len))
                die("the key \"%s\" appears twice in one mapping", key);
        c->keys[c->n] = key;
        c->key_lens[c->n] = key_len;
    }
    c->items[c->n++] = item;
}

/* A growing string. */
typedef struct {
    char *s;
    size_t n, cap;
} text;

static void put_n(text *t, const char *s, size_t n)
{
    if (t->n + n + 1 > t->cap) {
        t->cap = (t->n + n + 1) * 2;
        t->s = xrealloc(t->s, t->cap);
    }
    memcpy(t->s + t->n, s, n);
    t->n += n;
    t->s[t->n] = '\0';
}

static void put_c(text *t, char c)
{
    put_n(t, &c, 1);
}

/* -------------------------------------------------------------- types */

/* Plain scalars that YAML 1.1 or 1.2 reads as something other than a
 * string, beyond the forms accepted below (PyYAML's resolvers, and the 1.2
 * core schema's). */
static const char *const other_meanings[] = {
    "^(y|Y|yes|Yes|YES|n|N|no|No|NO|on|On|ON|off|Off|OFF)$",       /* 1.1 booleans */
    "^[-+]?0b[0-1_]+$",                                            /* 1.1 integers */
    "^[-+]?0[0-7_]+$",
    "^[-+]?(0|[1-9][0-9_]*)$",
    "^[-+]?0x[0-9a-fA-F_]+$",
    "^[-+]?[1-9][0-9_]*(:[0-5]?[0-9])+$",
    "^[-+]?[0-9][0-9_]*\\.[0-9_]*([eE][-+][0-9]+)?$",              /* 1.1 floats */
    "^\\.[0-9_]+([eE][-+][0-9]+)?$",
    "^[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+\\.[0-9_]*$",
    "^[-+]?\\.(inf|Inf|INF)$",
    "^\\.(nan|NaN|NAN)$",
    "^[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?",                 /* 1.1 timestamps */
    "^(<<|=)$",                                                    /* 1.1 merge, value */
    "^[-+]?[0-9]+$",                                               /* 1.2 integers */
    "^0o[0-7]+$",
    "^0x[0-9a-fA-F]+$",
    "^[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?$",     /* 1.2 floats */
};
#define N_OTHER (sizeof other_meanings / sizeof other_meanings[0])

static regex_t integer, decimal, others[N_OTHER];

static void compile_types(void)
{
    if (regcomp(&integer, "^-?(0|[1-9][0-9]*)$", REG_EXTENDED | REG_NOSUB) ||
        regcomp(&decimal, "^-?(0|[1-9][0-9]*)\\.[0-9]+([eE][-+][0-9]+)?$",
                REG_EXTENDED | REG_NOSUB))
        die("cannot compile a pattern");
    for (size_t i = 0; i < N_OTHER; i++)
        if (regcomp(&others[i], other_meanings[i], REG_EXTENDED | REG_NOSUB))
            die("cannot compile pattern %s", other_meanings[i]);
}

static bool matches(const regex_t *re, const char *s)
{
    return regexec(re, s, 0, NULL, 0) == 0;
}

/* The value of the plain scalar s[0..n) (trimmed). */
static value *plain(const char *s, size_t n)
{
    char *t = xrealloc(NULL, n + 1);
    memcpy(t, s, n);
    t[n] = '\0';
    value *v = NULL;
    if (!strcmp(t, "") || !strcmp(t, "~") || !strcmp(t, "null") || !strcmp(t, "Null") ||
        !strcmp(t, "NULL"))
        v = new_value(V_NULL);
    else if (!strcmp(t, "true") || !strcmp(t, "True") || !strcmp(t, "TRUE"))
        v = new_text(V_BOOL, "true", 4);
    else if (!strcmp(t, "false") || !strcmp(t, "False") || !strcmp(t, "FALSE"))
        v = new_text(V_BOOL, "false", 5);
    else if (matches(&integer, t) || matches(&decimal, t))
        v = new_text(V_NUMBER, t, n);
    if (!v) {
        for (size_t i = 0; i < N_OTHER; i++)
            if (matches(&others[i], t))
                die("\"%s\" means different things in YAML 1.1 and 1.2, or something JSON "
                    "has not: quote it (or write a number as -12 or 0.5, 1.0e-3)", t);
        if (strchr("&*!%@`|>,]}", t[0]) || (strchr("-?:", t[0]) && t[1] == ' '))
            die("\"%s\" starts with a YAML indicator this converter does not take "
                "(anchors, aliases, tags, directives): quote it", t);
        v = new_text(V_STRING, t, n);
    }
    free(t);
    return v;
}

/* -------------------------------------------------------------- lines */

typedef struct {
    char *text;  /* the line, without its newline */
    size_t len;
    int indent;  /* leading spaces */
    bool blank;  /* nothing but spaces, or a comment */
} line;

static line *lines;
static int n_lines;
static int at; /* the line being read */

static void split_lines(char *buf, size_t len)
{
    int cap = 0;
    char *p = buf, *end = buf + len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *e = nl ? nl : end;
        if (e > p && e[-1] == '\r')
            die("line %d ends in CR LF: write LF line ends", n_lines + 1);
        *e = '\0';
        if (n_lines == cap) {
            cap = cap ? 2 * cap : 1024;
            lines = xrealloc(lines, (size_t)cap * sizeof *lines);
        }
        line *l = &lines[n_lines++];
        l->text = p;
        l->len = (size_t)(e - p);
        l->indent = 0;
        while (p[l->indent] == ' ')
            l->indent++;
        if (p[l->indent] == '\t')
            error_line = n_lines, die("a tab in the indentation: indent with spaces");
        l->blank = p[l->indent] == '\0' || p[l->indent] == '#';
        p = e + 1;
    }
}

/* The next line with content (from `at`), or -1. */
static int next_content(void)
{
    int i = at;
    while (i < n_lines && lines[i].blank)
        i++;
    return i < n_lines ? i : -1;
}

/* s with a plain scalar's comment (" #...") and trailing spaces cut:
 * its new length. */
static size_t cut_comment(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] == '#' && (i == 0 || s[i - 1] == ' ')) {
            n = i;
            break;
        }
    while (n && s[n - 1] == ' ')
        n--;
    return n;
}

static bool only_comment(const char *s)
{
    while (*s == ' ')
        s++;
    return *s == '\0' || *s == '#';
}

/* ------------------------------------------------------------ scalars */

static void put_utf8(text *t, uint32_t c)
{
    if (c < 0x80) {
        put_c(t, (char)c);
    } else if (c < 0x800) {
        put_c(t, (char)(0xc0 | c >> 6));
        put_c(t, (char)(0x80 | (c & 63)));
    } else if (c < 0x10000) {
        put_c(t, (char)(0xe0 | c >> 12));
        put_c(t, (char)(0x80 | (c >> 6 & 63)));
        put_c(t, (char)(0x80 | (c & 63)));
    } else {
        put_c(t, (char)(0xf0 | c >> 18));
        put_c(t, (char)(0x80 | (c >> 12 & 63)));
        put_c(t, (char)(0x80 | (c >> 6 & 63)));
        put_c(t, (char)(0x80 | (c & 63)));
    }
}

static uint32_t hex_digits(const char *p, int n)
{
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            die("\\%c needs %d hex digits", p[-1], n);
        v = v * 16 + (uint32_t)d;
    }
    return v;
}

/* The quoted scalar at *p (at its quote), on this line; *p moves past it. */
static value *quoted(const char **p)
{
    char q = **p;
    const char *s = *p + 1;
    text t = {0};
    put_n(&t, "", 0);
    for (;;) {
        if (!*s)
            die("a quoted string does not end on its line: end it, or use a block "
                "scalar (| or >) for text over several lines");
        if (q == '\'' && *s == '\'') {
            if (s[1] != '\'')
                break;
            put_c(&t, '\'');
            s += 2;
        } else if (q == '"' && *s == '"') {
            break;
        } else if (q == '"' && *s == '\\') {
            s++;
            switch (*s) {
            case '"': put_c(&t, '"'); break;
            case '\\': put_c(&t, '\\'); break;
            case '/': put_c(&t, '/'); break;
            case 'n': put_c(&t, '\n'); break;
            case 't': put_c(&t, '\t'); break;
            case 'r': put_c(&t, '\r'); break;
            case 'b': put_c(&t, '\b'); break;
            case 'f': put_c(&t, '\f'); break;
            case '0': put_c(&t, '\0'); break;
            case ' ': put_c(&t, ' '); break;
            case 'x': put_utf8(&t, hex_digits(s + 1, 2)); s += 2; break;
            case 'u': put_utf8(&t, hex_digits(s + 1, 4)); s += 4; break;
            case 'U': put_utf8(&t, hex_digits(s + 1, 8)); s += 8; break;
            default: die("the escape \\%c is not one this converter takes", *s);
            }
            s++;
        } else {
            put_c(&t, *s++);
        }
    }
    *p = s + 1;
    value *v = new_text(V_STRING, t.s, t.n);
    free(t.s);
    return v;
}

/* ------------------------------------------------------ flow collections */

static const char *skip_spaces(const char *p)
{
    while (*p == ' ')
        p++;
    return p;
}

static value *flow_value(const char **p);

/* A plain scalar in a flow collection: up to , [ ] { } or ": ". */
static value *flow_plain(const char **p)
{
    const char *s = *p, *e = s;
    while (*e && !strchr(",[]{}", *e) && !(*e == ':' && (e[1] == ' ' || strchr(",]}", e[1]))) &&
           !(*e == '#' && e > s && e[-1] == ' '))
        e++;
    *p = e;
    while (e > s && e[-1] == ' ')
        e--;
    if (e == s)
        die("an empty entry in a flow collection");
    return plain(s, (size_t)(e - s));
}

static value *flow_key(const char **p, char **key, size_t *key_len)
{
    const char *s = skip_spaces(*p);
    value *k = *s == '"' || *s == '\'' ? quoted(&s) : flow_plain(&s);
    if (k->kind != V_STRING)
        die("a key that is not a string: quote it");
    s = skip_spaces(s);
    if (*s != ':')
        die("a flow mapping's entry needs \"key: value\"");
    *p = s + 1;
    *key = k->text;
    *key_len = k->len;
    free(k);
    return NULL;
}

static value *flow_value(const char **p)
{
    const char *s = skip_spaces(*p);
    value *v;
    if (*s == '[' || *s == '{') {
        bool map = *s == '{';
        char close = map ? '}' : ']';
        v = new_value(map ? V_MAP : V_SEQ);
        s = skip_spaces(s + 1);
        while (*s != close) {
            char *key = NULL;
            size_t key_len = 0;
            if (map)
                flow_key(&s, &key, &key_len);
            value *item = flow_value(&s);
            append(v, key, key_len, item);
            s = skip_spaces(s);
            if (*s == ',')
                s = skip_spaces(s + 1);
            else if (*s != close)
                die("expected ',' or '%c' in a flow collection (which must end on its "
                    "line)", close);
        }
        s++;
    } else if (*s == '"' || *s == '\'') {
        v = quoted(&s);
    } else {
        v = flow_plain(&s);
    }
    *p = s;
    return v;
}

/* ------------------------------------------------------------- blocks */

static value *block(int indent);

/* The block scalar whose header (| or >, chomping) is at h, on the line
 * before `at`; its lines are more indented than `parent`. */
static value *block_scalar(const char *h, int parent)
{
    bool folded = *h == '>';
    int chomp = 0; /* -1 strip, 0 clip, +1 keep */
    h++;
    if (*h == '-' || *h == '+')
        chomp = *h++ == '-' ? -1 : 1;
    if (*h >= '1' && *h <= '9')
        die("explicit indentation of a block scalar is not taken: indent its text");
    if (!only_comment(h))
        die("unexpected text after a block scalar's header");
    /* Its indentation: its first line with text. */
    int first = at;
    while (first < n_lines && lines[first].indent == (int)lines[first].len)
        first++; /* lines of spaces only */
    int indent = first < n_lines ? lines[first].indent : parent + 1;
    if (indent <= parent) {
        indent = parent + 1; /* an empty scalar */
        first = at;
    }
    for (int i = at; i < first; i++)
        if (lines[i].indent > indent)
            error_line = i + 1,
            die("a blank line more indented than the text after it begins a block scalar");
    text t = {0};
    put_n(&t, "", 0);
    int breaks = 0;          /* empty lines since the last text line */
    bool have = false, last_regular = false;
    int i = at;
    for (; i < n_lines; i++) {
        line *l = &lines[i];
        if (l->indent == (int)l->len && l->indent <= indent) { /* an empty line */
            breaks++;
            continue;
        }
        if (l->indent < indent)
            break;
        const char *content = l->text + indent;
        bool regular = content[0] != ' ' && content[0] != '\t';
        if (have) {
            /* the line break before this line, then the empty lines */
            if (folded && last_regular && regular) {
                if (breaks == 0)
                    put_c(&t, ' ');
            } else {
                put_c(&t, '\n');
            }
            for (int b = 0; b < breaks; b++)
                put_c(&t, '\n');
        } else {
            for (int b = 0; b < breaks; b++)
                put_c(&t, '\n');
        }
        breaks = 0;
        put_n(&t, content, l->len - (size_t)indent);
        have = true;
        last_regular = regular;
    }
    at = i;
    if (have && chomp >= 0)
        put_c(&t, '\n');
    if (chomp > 0)
        for (int b = 0; b < breaks; b++)
            put_c(&t, '\n');
    /* Trailing empty lines belong to what follows when they are not kept. */
    value *v = new_text(V_STRING, t.s, t.n);
    free(t.s);
    return v;
}

/* The plain scalar starting at s (on the line before `at`) and its
 * continuation lines, more indented than `parent`, folded. */
static value *block_plain(const char *s, int parent)
{
    text t = {0};
    size_t n = cut_comment(s, strlen(s));
    put_n(&t, s, n);
    if (memchr(s, ':', n) && strstr(t.s, ": "))
        die("\": \" in a plain scalar: quote the text");
    int empties = 0;
    while (at < n_lines) {
        line *l = &lines[at];
        if (l->indent == (int)l->len) {
            empties++;
            at++;
            continue;
        }
        if (l->blank || l->indent <= parent)
            break;
        const char *c = l->text + l->indent;
        size_t k = cut_comment(c, strlen(c));
        if (memchr(c, ':', k) && (strstr(c, ": ") || c[k - 1] == ':'))
            error_line = at + 1, die("\": \" in a plain scalar: quote the text");
        if (empties)
            for (int e = 0; e < empties; e++)
                put_c(&t, '\n');
        else
            put_c(&t, ' ');
        empties = 0;
        put_n(&t, c, k);
        at++;
    }
    value *v = plain(t.s, t.n);
    free(t.s);
    return v;
}

/* The value that starts at s, on the line before `at`, in a block
 * collection indented `parent` (a mapping's value when in_map); with
 * nothing there, the block below. */
static value *block_value(const char *s, int parent, bool in_map)
{
    s = skip_spaces(s);
    if (*s == '\0' || *s == '#') {
        int next = next_content();
        if (next < 0)
            return new_value(V_NULL);
        line *l = &lines[next];
        /* A mapping's sequence may sit at the mapping's own indentation. */
        bool dash = l->text[l->indent] == '-' &&
                    (l->text[l->indent + 1] == ' ' || l->text[l->indent + 1] == '\0');
        if (l->indent > parent || (l->indent == parent && dash && in_map))
            return block(l->indent);
        return new_value(V_NULL);
    }
    if (*s == '|' || *s == '>')
        return block_scalar(s, parent);
    if (*s == '[' || *s == '{' || *s == '"' || *s == '\'') {
        const char *p = s;
        value *v = flow_value(&p);
        if (!only_comment(p))
            die("unexpected text after a value: \"%s\"", p);
        return v;
    }
    if (*s == '&' || *s == '*' || *s == '!' || *s == '?')
        die("anchors, aliases, tags and complex keys are not taken: \"%s\"", s);
    return block_plain(s, parent);
}

/* The key of a block mapping's line at s: its length, and *rest the text
 * after the ':'; 0 when the line is not "key: ...". */
static bool block_key(const char *s, char **key, size_t *key_len, const char **rest)
{
    const char *e;
    if (*s == '[' || *s == '{')
        return false; /* a flow collection, which is no key here */
    if (*s == '"' || *s == '\'') {
        const char *p = s;
        value *k = quoted(&p);
        if (*p != ':' || (p[1] != ' ' && p[1] != '\0')) {
            free(k->text);
            free(k);
            return false;
        }
        *key = k->text;
        *key_len = k->len;
        free(k);
        *rest = p + 1;
        return true;
    }
    for (e = s; *e; e++) {
        if (*e == ':' && (e[1] == ' ' || e[1] == '\0'))
            break;
        if (*e == '#' && e > s && e[-1] == ' ')
            return false;
    }
    if (!*e)
        return false;
    const char *end = e;
    while (end > s && end[-1] == ' ')
        end--;
    value *k = plain(s, (size_t)(end - s));
    if (k->kind != V_STRING)
        die("the key \"%.*s\" is not a string in YAML: quote it", (int)(end - s), s);
    *key = k->text;
    *key_len = k->len;
    free(k);
    *rest = e + 1;
    return true;
}

/* A block sequence or mapping whose lines are indented `indent`, from the
 * next line with content. */
static value *block(int indent)
{
    value *v = NULL;
    for (;;) {
        int i = next_content();
        if (i < 0 || lines[i].indent < indent)
            break;
        error_line = i + 1;
        line *l = &lines[i];
        if (l->indent > indent)
            die("this line is indented more than the lines before it");
        char *s = l->text + indent;
        bool dash = s[0] == '-' && (s[1] == ' ' || s[1] == '\0');
        if (!v)
            v = new_value(dash ? V_SEQ : V_MAP);
        if (dash != (v->kind == V_SEQ))
            die(dash ? "a sequence entry among a mapping's keys"
                     : "a mapping key among a sequence's entries");
        if (dash) {
            /* "- x": x is a block of its own, indented where it starts; the
             * dash becomes a space so that x's line reads as that block's. */
            const char *after = skip_spaces(s + 1);
            if (*after == '\0' || *after == '#') {
                at = i + 1;
                append(v, NULL, 0, block_value(after, indent, false));
                continue;
            }
            s[0] = ' ';
            int inner = (int)(after - l->text);
            char *key;
            size_t key_len;
            const char *rest;
            bool nested_dash = after[0] == '-' && (after[1] == ' ' || after[1] == '\0');
            if (nested_dash || block_key(after, &key, &key_len, &rest)) {
                if (!nested_dash)
                    free(key);
                l->indent = inner;
                at = i;
                append(v, NULL, 0, block(inner));
            } else {
                at = i + 1;
                append(v, NULL, 0, block_value(after, indent, false));
            }
            continue;
        }
        if (!strncmp(s, "---", 3) || !strncmp(s, "...", 3))
            die("several YAML documents in one file are not taken");
        char *key;
        size_t key_len;
        const char *rest;
        if (!block_key(s, &key, &key_len, &rest))
            die("expected \"key: value\" (or a key that is not a string: quote it)");
        at = i + 1;
        value *item = block_value(rest, indent, true);
        error_line = i + 1;
        append(v, key, key_len, item);
    }
    return v ? v : new_value(V_NULL);
}

/* -------------------------------------------------------------- output */

static void write_string(FILE *out, const char *s, size_t n)
{
    fputc('"', out);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\t': fputs("\\t", out); break;
        case '\r': fputs("\\r", out); break;
        default:
            if (c < 0x20 || c == 0x7f)
                fprintf(out, "\\u%04x", c);
            else
                fputc(c, out);
        }
    }
    fputc('"', out);
}

static void write_value(FILE *out, const value *v, int depth)
{
    switch (v->kind) {
    case V_NULL: fputs("null", out); return;
    case V_BOOL:
    case V_NUMBER: fputs(v->text, out); return;
    case V_STRING: write_string(out, v->text, v->len); return;
    case V_SEQ:
    case V_MAP: break;
    }
    bool map = v->kind == V_MAP;
    if (v->n == 0) {
        fputs(map ? "{}" : "[]", out);
        return;
    }
    fputs(map ? "{\n" : "[\n", out);
    for (size_t i = 0; i < v->n; i++) {
        fprintf(out, "%*s", 2 * (depth + 1), "");
        if (map) {
            write_string(out, v->keys[i], v->key_lens[i]);
            fputs(": ", out);
        }
        write_value(out, v->items[i], depth + 1);
        fputs(i + 1 < v->n ? ",\n" : "\n", out);
    }
    fprintf(out, "%*s%c", 2 * depth, "", map ? '}' : ']');
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: yaml2json FILE.yaml > FILE.json\n");
        return 2;
    }
    file_name = argv[1];
    FILE *f = fopen(file_name, "rb");
    if (!f)
        die("%s", strerror(errno));
    text t = {0};
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        put_n(&t, chunk, got);
    fclose(f);
    if (!t.s)
        die("the file is empty");
    if (memchr(t.s, '\0', t.n))
        die("the file holds a NUL byte");
    compile_types();
    split_lines(t.s, t.n);
    at = 0;
    int first = next_content();
    if (first >= 0 && !strcmp(lines[first].text, "---"))
        at = first + 1; /* one document marker at the top is allowed */
    first = next_content();
    if (first < 0)
        die("no content");
    if (lines[first].text[0] == '%')
        error_line = first + 1, die("YAML directives are not taken");
    value *doc = block(lines[first].indent);
    int rest = next_content();
    if (rest >= 0)
        error_line = rest + 1, die("this line is indented less than the document's first");
    write_value(stdout, doc, 0);
    fputc('\n', stdout);
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}
