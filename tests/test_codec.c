/*
 * The JSON text layer and the tensor codec (api/codec.h).
 *
 * References are independent of the code under test: the JSONTestSuite
 * corpus and jansson for the validator, glibc's strtod and printf for
 * numbers, RFC 4648's test vectors for base64, and hand-written texts for
 * the tensor forms.
 *
 * ATTND_TESTDATA points at tests/data (default "tests/data").
 */
#include <check.h>
#include <dirent.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "json/codec.h"
#include "json/codec_internal.h"
#include "request.h"
#include "json/pow10_table.h"
#include "support/float_check.h"

/* ------------------------------------------------------------- helpers */

/* For checks inside loops of up to a million cases: libcheck records the
 * location of every ck_assert as it passes (a write each), so hot loops
 * only call into it when a check fails. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            ck_abort_msg(__VA_ARGS__);                                                             \
    } while (0)

static uint64_t rng_next(uint64_t *s)
{
    /* splitmix64: reproducible inputs without depending on rand() */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static bool valid(const char *s)
{
    codec_error e;
    return codec_validate(s, strlen(s), &e);
}

/* (float)strtod, the reference reading of a number; false if not finite. */
static bool ref_parse(const char *s, float *out)
{
    double d = strtod(s, NULL);
    float f = (float)d;
    if (!isfinite(f))
        return false;
    *out = f;
    return true;
}

static bool same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* A codec error as clients see it: the API layer's one conversion gives its
 * status and code. */
static api_error seen(const codec_error *ce)
{
    api_error e;
    api_fail_codec(&e, ce);
    return e;
}

static const char *testdata(void)
{
    const char *d = getenv("ATTND_TESTDATA");
    return d && d[0] ? d : "tests/data";
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    /* exactly n bytes: no NUL after the body, so ASan sees any overread */
    char *buf = malloc(n ? (size_t)n : 1);
    ck_assert(buf != NULL);
    ck_assert_int_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Calls fn(name, text, len) for every file of the JSONTestSuite corpus. */
static int for_each_corpus_file(void (*fn)(const char *, const char *, size_t))
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/json_parsing", testdata());
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "cannot open %s (set ATTND_TESTDATA)", dir);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *name = de->d_name;
        size_t nl = strlen(name);
        if (nl < 6 || strcmp(name + nl - 5, ".json") != 0)
            continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        size_t len;
        char *text = read_file(path, &len);
        fn(name, text, len);
        free(text);
        n++;
    }
    closedir(d);
    return n;
}

/* Texts placed so that the last byte of each is the last readable byte
 * before a PROT_NONE page: any read past the end faults. A fence takes
 * texts of up to `cap` bytes, one after another (fence_put): a loop over
 * many texts maps and unmaps once, not once a text (an munmap in a process
 * with threads costs a TLB shootdown on every core). */
typedef struct {
    char *map, *end; /* end: the first byte of the PROT_NONE page */
    size_t map_len, cap;
} fenced;

static fenced fence_make(size_t cap)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = (cap + page - 1) / page + 1;
    fenced f = {.map_len = (pages + 1) * page, .cap = cap};
    f.map = mmap(NULL, f.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert(f.map != MAP_FAILED);
    ck_assert_int_eq(mprotect(f.map + pages * page, page, PROT_NONE), 0);
    f.end = f.map + pages * page;
    return f;
}

/* s[0..len) against the fence; returns where it starts. */
static const char *fence_put(fenced *f, const char *s, size_t len)
{
    CHECK(len <= f->cap, "a text of %zu bytes in a fence of %zu", len, f->cap);
    memcpy(f->end - len, s, len);
    return f->end - len;
}

static void unfence(fenced *f)
{
    munmap(f->map, f->map_len);
}

static bool decode(const char *s, bool mask, codec_tensor *t, codec_error *e)
{
    ck_assert_msg(codec_validate(s, strlen(s), e), "test text not valid JSON: %s", s);
    return codec_tensor_decode(s, s + strlen(s), "q", mask, t, e);
}

/* Decodes s expecting failure with this status, code and field. */
static void expect_error(const char *s, bool mask, int status, const char *code,
                         const char *field)
{
    codec_tensor t;
    codec_error e;
    memset(&e, 0, sizeof e);
    bool ok = decode(s, mask, &t, &e);
    if (ok)
        codec_tensor_free(&t);
    ck_assert_msg(!ok, "decoded but should fail: %s", s);
    api_error a = seen(&e);
    ck_assert_msg(a.status == status && strcmp(a.code, code) == 0 && strcmp(a.field, field) == 0,
                  "%s: got %d %s field=%s (%s), want %d %s field=%s", s, a.status, a.code,
                  a.field, a.message, status, code, field);
    ck_assert(t.f32 == NULL && t.b8 == NULL);
}

static char *encode_text(const float *x, int rank, const int64_t *shape, codec_encoding enc)
{
    codec_buf b = {0};
    codec_tensor_encode(&b, x, rank, shape, enc);
    ck_assert(!b.failed);
    codec_buf_append(&b, "", 0);
    char *s = strdup(b.data ? b.data : "");
    codec_buf_free(&b);
    return s;
}

/* ============================================================ validator */

static int corpus_y, corpus_n, corpus_i;

static void check_corpus_file(const char *name, const char *text, size_t len)
{
    codec_error e;
    bool ok = codec_validate(text, len, &e);
    if (name[0] == 'y') {
        corpus_y++;
        ck_assert_msg(ok, "%s rejected: %s", name, e.message);
        json_error_t je;
        /* jansson cannot hold a NUL in an object key (json_t keys are C
         * strings); that one file is RFC 8259 valid all the same */
        json_t *j = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        ck_assert_msg(j != NULL || strcmp(name, "y_object_escaped_null_in_key.json") == 0, "%s: we accept it but jansson does not: %s", name, je.text);
        json_decref(j);
    } else if (name[0] == 'n') {
        corpus_n++;
        ck_assert_msg(!ok, "%s accepted", name);
        ck_assert_int_eq(e.kind, CODEC_ERR_SYNTAX);
    } else if (name[0] == 'i') {
        corpus_i++;
        /* our choices for the implementation-defined cases: numbers too
         * large for a double are still JSON; invalid Unicode, a BOM and
         * 500 levels of nesting are not accepted */
        bool want = strncmp(name, "i_number_", 9) == 0;
        ck_assert_msg(ok == want, "%s: %s", name, ok ? "accepted" : e.message);
    }
}

START_TEST(validator_matches_jsontestsuite_corpus)
{
    int n = for_each_corpus_file(check_corpus_file);
    ck_assert_int_ge(n, 300);
    ck_assert_int_ge(corpus_y, 90);
    ck_assert_int_ge(corpus_n, 180);
    ck_assert_int_ge(corpus_i, 30);
}
END_TEST

/* Every corpus file, and each of its prefixes, placed against an
 * unreadable page: the validator never reads past the end. */
static void check_fenced(const char *name, const char *text, size_t len)
{
    (void)name;
    fenced f = fence_make(len);
    for (size_t cut = 0; cut <= len; cut += (len > 64 ? len / 16 + 1 : 1)) {
        codec_error e;
        (void)codec_validate(fence_put(&f, text, cut), cut, &e);
    }
    unfence(&f);
}

START_TEST(validator_never_reads_past_the_end)
{
    for_each_corpus_file(check_fenced);
    const char *cases[] = {"\"abc", "\"\\u12", "\"\\", "[1,", "{\"a\"", "tru", "-", "1e", "1.",
                           "\"\xe2\x82", "[\"\\ud800\\u"};
    fenced f = fence_make(64);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        codec_error e;
        const char *text = fence_put(&f, cases[i], strlen(cases[i]));
        ck_assert_msg(!codec_validate(text, strlen(cases[i]), &e), "%s", cases[i]);
    }
    unfence(&f);
}
END_TEST

START_TEST(validator_rejects_what_rfc8259_forbids)
{
    const char *bad[] = {
        "",              "  ",           "[1,]",          "{\"a\":1,}",     "[01]",
        "[-01]",         "[1.]",         "[.5]",          "[1e]",           "[+1]",
        "[NaN]",         "[Infinity]",   "[-Infinity]",   "['a']",          "[1] // c",
        "/* c */ [1]",   "[\"a\tb\"]",   "[\"\\x41\"]",   "[\"\\u12G4\"]",  "[\"\\ud800\"]",
        "[\"\\udc00\"]", "[\"\\ud800\\u0041\"]",           "\xef\xbb\xbf[]", "[1]\x0b",
        "[\x0c 1]",      "[1 2]",        "{\"a\" 1}",     "{1:2}",          "[true false]",
        "[\"\xc0\xaf\"]", /* overlong '/' */
        "[\"\xed\xa0\x80\"]", /* UTF-8 encoded surrogate */
        "[\"\xf4\x90\x80\x80\"]", /* above U+10FFFF */
        "[\"\x80\"]",    "[\"\xe2\x82\"]", "[1]]",         "[[1]",           "nul",
        "[1,,2]",        "{\"a\":1 \"b\":2}", "\"a\" \"b\"", "[\"\xc2\xa0\"]\xc2\xa0",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        codec_error e;
        memset(&e, 0, sizeof e);
        ck_assert_msg(!codec_validate(bad[i], strlen(bad[i]), &e), "accepted: %s", bad[i]);
        ck_assert_int_eq(e.kind, CODEC_ERR_SYNTAX);
    }
    const char *good[] = {
        "0", "-0", "-0.0e-0", "1E+2", "\"\"", "\"\\u0000\"", "\"\\ud83d\\ude00\"",
        "\"\xf0\x9f\x98\x80\"", "\"\xe2\x82\xac\"", "[]", "{}", " \t\r\n[ 1 , { \"a\" : [ ] } ] \n",
        "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "1e400", "123456789012345678901234567890",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        ck_assert_msg(valid(good[i]), "rejected: %s", good[i]);
}
END_TEST

START_TEST(validator_error_names_offset_line_and_column)
{
    const char *s = "{\n  \"a\": [1, 2,]\n}";
    codec_error e;
    ck_assert(!codec_validate(s, strlen(s), &e));
    /* the ']' after the trailing comma is byte 15, line 2, column 14 */
    ck_assert_msg(strstr(e.message, "byte 15") && strstr(e.message, "line 2") &&
                      strstr(e.message, "column 14"),
                  "%s", e.message);
    ck_assert_str_eq(e.field, "");
}
END_TEST

START_TEST(validator_bounds_nesting_without_recursion)
{
    char deep[CODEC_MAX_DEPTH * 2 + 2];
    for (int i = 0; i < CODEC_MAX_DEPTH; i++) {
        deep[i] = '[';
        deep[2 * CODEC_MAX_DEPTH - 1 - i] = ']';
    }
    codec_error e;
    ck_assert(codec_validate(deep, 2 * CODEC_MAX_DEPTH, &e));
    char deeper[CODEC_MAX_DEPTH * 2 + 2];
    for (int i = 0; i <= CODEC_MAX_DEPTH; i++) {
        deeper[i] = '[';
        deeper[2 * CODEC_MAX_DEPTH + 1 - i] = ']';
    }
    ck_assert(!codec_validate(deeper, 2 * CODEC_MAX_DEPTH + 2, &e));
    ck_assert_msg(strstr(e.message, "nesting"), "%s", e.message);

    size_t n = 10 * 1000 * 1000;
    char *open = malloc(n);
    ck_assert(open != NULL);
    memset(open, '[', n);
    double t0 = now_s();
    ck_assert(!codec_validate(open, n, &e));
    ck_assert_msg(now_s() - t0 < 0.05, "10M '[' took %.3f s", now_s() - t0);
    memset(open, '{', n);
    ck_assert(!codec_validate(open, n, &e));
    free(open);
}
END_TEST

START_TEST(validator_checks_every_byte_of_long_strings)
{
    /* strings are scanned 8 bytes at a time: a bad byte at any position of
     * a long string, and at any alignment, must still be seen */
    const char *bad[] = {"\x01", "\x1f", "\x80", "\xff", "\xc3", "\\x", "\\u12G"};
    for (size_t b = 0; b < sizeof bad / sizeof *bad; b++)
        for (int at = 0; at < 40; at++) {
            char s[128];
            int n = snprintf(s, sizeof s, "[\"%.*s%s%.*s\"]", at, "abcdefghijklmnopqrstuvwxyz0123456789ABCD",
                             bad[b], 40 - at, "abcdefghijklmnopqrstuvwxyz0123456789ABCD");
            codec_error e;
            ck_assert_msg(!codec_validate(s, (size_t)n, &e), "accepted %s", s);
        }
    for (int at = 0; at < 40; at++) {
        char s[128];
        int n = snprintf(s, sizeof s, "[\"%.*s\\\"\\\\\xc3\xa9\\n%.*s\"]", at,
                         "abcdefghijklmnopqrstuvwxyz0123456789ABCD", 40 - at,
                         "abcdefghijklmnopqrstuvwxyz0123456789ABCD");
        codec_error e;
        ck_assert_msg(codec_validate(s, (size_t)n, &e), "rejected %s: %s", s, e.message);
        ck_assert_int_eq(codec_skip_value(s + 1, s + n) - s, n - 1);
    }
}
END_TEST

/* ======================================================= skip / members */

START_TEST(skip_finds_the_end_of_each_value)
{
    const char *vals[] = {"\"a\\\"]b\"", "-12.5e3", "true", "null", "[1,[2,\"]\"],{}]",
                          "{\"a\":{\"b\":\"}\"}}", "[]", "\"a\\\\\"", "\"\\\\\\\"\"",
                          "[1111111111111111111, \"]]]]]]]]]]\\\\\", 2222222222222222, [[[]]]]",
                          "{\"longer key than eight\": [\"Yy_\", 0.12345678901234]}"};
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
        char text[128];
        snprintf(text, sizeof text, "%s , 7", vals[i]);
        ck_assert_msg(valid(vals[i]), "%s", vals[i]);
        const char *end = codec_skip_value(text, text + strlen(text));
        ck_assert_int_eq(end - text, (long)strlen(vals[i]));
    }
}
END_TEST

START_TEST(members_lists_decoded_keys_and_value_spans)
{
    const char *s = "{ \"q\" : [1, 2] , \"caus\\u0061l\":true,\"\\ud83d\\ude00\": {\"x\":1}, \"\":null }";
    codec_member m[8];
    size_t n;
    codec_error e;
    ck_assert(valid(s));
    ck_assert(codec_members(s, s + strlen(s), m, 8, &n, "", &e));
    ck_assert_int_eq(n, 4);
    ck_assert_str_eq(m[0].key, "q");
    ck_assert_int_eq(m[0].value_end - m[0].value, 6);
    ck_assert(strncmp(m[0].value, "[1, 2]", 6) == 0);
    ck_assert_str_eq(m[1].key, "causal");
    ck_assert(strncmp(m[1].value, "true", 4) == 0 && m[1].value_end - m[1].value == 4);
    ck_assert_str_eq(m[2].key, "\xf0\x9f\x98\x80");
    ck_assert(strncmp(m[2].value, "{\"x\":1}", 7) == 0 && m[2].value_end - m[2].value == 7);
    ck_assert_str_eq(m[3].key, "");
    ck_assert(!m[3].key_too_long);

    const char *empty = " {} ";
    ck_assert(codec_members(empty, empty + 4, m, 8, &n, "", &e));
    ck_assert_int_eq(n, 0);
}
END_TEST

static void expect_members_error(const char *s, size_t max, const char *where, int status,
                                 const char *code, const char *field)
{
    codec_member m[16];
    size_t n;
    codec_error e;
    memset(&e, 0, sizeof e);
    ck_assert_msg(valid(s), "%s", s);
    ck_assert_msg(!codec_members(s, s + strlen(s), m, max, &n, where, &e), "%s", s);
    api_error a = seen(&e);
    ck_assert_msg(a.status == status && !strcmp(a.code, code) && (!field || !strcmp(a.field, field)),
                  "%s: %d %s %s (%s)", s, a.status, a.code, a.field, a.message);
    /* the members the validator noted give the same error */
    codec_span spans[16];
    codec_doc doc;
    codec_error e2;
    memset(&e2, 0, sizeof e2);
    ck_assert(codec_doc_validate(&doc, s, strlen(s), spans, 16, &e2));
    size_t members = doc.members;
    bool failed = members && !codec_doc_members(&doc, m, max, &n, where, &e2);
    codec_doc_free(&doc);
    if (members == 0)
        return; /* not an object: the body's own check refuses it */
    ck_assert_msg(failed, "%s", s);
    ck_assert_msg(e2.kind == e.kind &&
                  !strcmp(e2.field, e.field) && !strcmp(e2.message, e.message),
                  "%s: %s / %s", s, e.message, e2.message);
}

/* The spans codec_doc_validate notes list the members that codec_members
 * finds by walking the text. */
static void expect_same_members(const char *s)
{
    codec_member a[16], b[16];
    codec_span spans[16];
    size_t na, nb, members;
    codec_error e;
    codec_doc doc;
    const char *end = s + strlen(s);
    ck_assert_msg(codec_doc_validate(&doc, s, strlen(s), spans, 16, &e), "%s", s);
    members = doc.members;
    ck_assert_msg(codec_members(s, end, a, 16, &na, "", &e), "%s", s);
    ck_assert_msg(codec_doc_members(&doc, b, 16, &nb, "", &e), "%s", s);
    codec_doc_free(&doc);
    ck_assert_int_eq(members, na);
    ck_assert_int_eq(nb, na);
    for (size_t i = 0; i < na; i++) {
        ck_assert_str_eq(a[i].key, b[i].key);
        ck_assert(a[i].key_too_long == b[i].key_too_long);
        ck_assert(a[i].key_text == b[i].key_text);
        ck_assert_msg(a[i].value == b[i].value && a[i].value_end == b[i].value_end,
                      "%s: member %zu", s, i);
    }
}

START_TEST(validator_notes_the_members_of_the_object)
{
    expect_same_members("{ \"q\" : [1, 2] , \"caus\\u0061l\":true,\"\\ud83d\\ude00\": {\"x\":1}, "
                        "\"\":null }");
    expect_same_members("{}");
    expect_same_members(" {\"a\":[],\"b\":{},\"c\":\"}\\\"]\",\"d\":-1.5e3 ,\"e\":[[[]],[{}]]}\n");
    expect_same_members("{\"q\":{\"shape\":[2],\"data\":[1,2]},\"k\":[[1, 2], [3, 4]],\"v\":0}");
    /* nested objects' members are not the body's */
    codec_span spans[4];
    codec_doc doc;
    codec_error e;
    const char *nested = "{\"a\":{\"b\":1,\"c\":2,\"d\":3}}";
    ck_assert(codec_doc_validate(&doc, nested, strlen(nested), spans, 4, &e));
    ck_assert_int_eq(doc.members, 1);
    codec_doc_free(&doc);
    /* all members are counted, only `cap` noted */
    const char *five = "{\"a\":1,\"b\":2,\"c\":3,\"d\":4,\"e\":5}";
    ck_assert(codec_doc_validate(&doc, five, strlen(five), spans, 4, &e));
    ck_assert_int_eq(doc.members, 5);
    ck_assert(strncmp(spans[3].value, "4", 1) == 0 && spans[3].value_end == spans[3].value + 1);
    codec_doc_free(&doc);
    /* not an object: no members */
    ck_assert(codec_doc_validate(&doc, "[{\"a\":1}]", 9, spans, 4, &e));
    ck_assert_int_eq(doc.members, 0);
    codec_doc_free(&doc);
}
END_TEST

START_TEST(members_detects_duplicates_after_decoding)
{
    expect_members_error("{\"q\":1,\"k\":2,\"q\":3}", 8, "", 400, "duplicate_key", "q");
    expect_members_error("{\"q\":1,\"\\u0071\":2}", 8, "", 400, "duplicate_key", "q");
    expect_members_error("{\"shape\":1,\"sh\\u0061pe\":2}", 8, "q", 400, "duplicate_key",
                         "q.shape");
    /* a surrogate pair and the same code point in raw UTF-8 */
    expect_members_error("{\"\\ud83d\\ude00\":1,\"\xf0\x9f\x98\x80\":2}", 8, "", 400,
                         "duplicate_key", "\xf0\x9f\x98\x80");
    /* keys longer than codec_member.key are compared whole */
    char s[1024], k1[200], k2[200];
    memset(k1, 'a', 150);
    k1[150] = 0;
    strcpy(k2, k1);
    k2[149] = 'b';
    snprintf(s, sizeof s, "{\"%s\":1,\"%s\":2}", k1, k2);
    codec_member m[8];
    size_t n;
    codec_error e;
    ck_assert(codec_members(s, s + strlen(s), m, 8, &n, "", &e));
    ck_assert(m[0].key_too_long && m[1].key_too_long);
    snprintf(s, sizeof s, "{\"%s\":1,\"x\":0,\"%.149s\\u0061\":2}", k1, k1);
    expect_members_error(s, 8, "", 400, "duplicate_key", NULL);
    /* a key holding NUL is never taken for a known field */
    const char *nul = "{\"q\\u0000x\":1,\"q\":2}";
    ck_assert(codec_members(nul, nul + strlen(nul), m, 8, &n, "", &e));
    ck_assert(m[0].key_too_long);
    ck_assert(!m[1].key_too_long);
}
END_TEST

START_TEST(members_refuses_non_objects_and_too_many_fields)
{
    expect_members_error("[1]", 8, "", 400, "wrong_type", "");
    expect_members_error("3", 8, "q", 400, "wrong_type", "q");
    expect_members_error("{\"a\":1,\"b\":2,\"c\":3}", 2, "", 400, "too_many_fields", "");
}
END_TEST

/* ========================================================== tensors in */

START_TEST(decode_nested_ranks_two_to_four)
{
    codec_tensor t;
    codec_error e;
    ck_assert(decode("[[1, 2.5, -3], [4e1, 0.1, -0]]", false, &t, &e));
    ck_assert_int_eq(t.dtype, CODEC_F32);
    ck_assert_int_eq(t.rank, 2);
    ck_assert_int_eq(t.shape[0], 2);
    ck_assert_int_eq(t.shape[1], 3);
    ck_assert_int_eq(t.count, 6);
    float want[] = {1, 2.5f, -3, 40, 0.1f, -0.0f};
    for (int i = 0; i < 6; i++)
        ck_assert(same_bits(t.f32[i], want[i]));
    codec_tensor_free(&t);

    ck_assert(decode(" [ [ [1,2] , [3,4] , [5,6] ] ] ", false, &t, &e));
    ck_assert_int_eq(t.rank, 3);
    ck_assert(t.shape[0] == 1 && t.shape[1] == 3 && t.shape[2] == 2);
    for (int i = 0; i < 6; i++)
        ck_assert(t.f32[i] == (float)(i + 1));
    codec_tensor_free(&t);

    /* rank 4, [2, 3, 4, 5], values 0..119 */
    char s[4096];
    int w = 0, v = 0;
    w += sprintf(s + w, "[");
    for (int a = 0; a < 2; a++) {
        w += sprintf(s + w, "%s[", a ? "," : "");
        for (int b = 0; b < 3; b++) {
            w += sprintf(s + w, "%s[", b ? "," : "");
            for (int c = 0; c < 4; c++) {
                w += sprintf(s + w, "%s[", c ? "," : "");
                for (int d = 0; d < 5; d++)
                    w += sprintf(s + w, "%s%d", d ? ", " : "", v++);
                w += sprintf(s + w, "]");
            }
            w += sprintf(s + w, "]");
        }
        w += sprintf(s + w, "]");
    }
    sprintf(s + w, "]");
    ck_assert(decode(s, false, &t, &e));
    ck_assert_int_eq(t.rank, 4);
    ck_assert(t.shape[0] == 2 && t.shape[1] == 3 && t.shape[2] == 4 && t.shape[3] == 5);
    ck_assert_int_eq(t.count, 120);
    for (int i = 0; i < 120; i++)
        ck_assert(t.f32[i] == (float)i);
    codec_tensor_free(&t);

    /* rank up to CODEC_MAX_RANK decodes (the handler refuses > 4 itself) */
    ck_assert(decode("[[[[[[[[1]]]]]]]]", false, &t, &e));
    ck_assert_int_eq(t.rank, 8);
    codec_tensor_free(&t);
}
END_TEST

START_TEST(decode_long_rows_match_strtod)
{
    /* rows longer than the element buffer's first sizes, short numbers so
     * that the first guess from the text length is too small */
    for (int rows = 1; rows <= 3; rows++) {
        int cols = 5000;
        char *s = malloc((size_t)rows * cols * 16 + 16);
        size_t w = 0;
        s[w++] = '[';
        uint64_t seed = (uint64_t)rows;
        for (int r = 0; r < rows; r++) {
            w += (size_t)sprintf(s + w, "%s[", r ? ", " : "");
            for (int c = 0; c < cols; c++) {
                uint64_t x = rng_next(&seed);
                if (x % 3)
                    w += (size_t)sprintf(s + w, "%s%d", c ? "," : "", (int)(x % 10));
                else
                    w += (size_t)sprintf(s + w, "%s%.6g", c ? ", " : "", (double)(int64_t)x * 1e-19);
            }
            s[w++] = ']';
        }
        s[w++] = ']';
        s[w] = 0;
        codec_tensor t;
        codec_error e;
        ck_assert(decode(s, false, &t, &e));
        ck_assert(t.rank == 2 && t.shape[0] == rows && t.shape[1] == cols);
        /* the reference: strtod over the same text */
        const char *p = s;
        for (int64_t i = 0; i < t.count; i++) {
            while (*p == '[' || *p == ',' || *p == ' ' || *p == ']')
                p++;
            char *q;
            float want = (float)strtod(p, &q);
            CHECK(same_bits(t.f32[i], want), "element %lld", (long long)i);
            p = q;
        }
        codec_tensor_free(&t);
        free(s);
    }
}
END_TEST

START_TEST(decode_bool_masks_in_every_form)
{
    codec_tensor t;
    codec_error e;
    ck_assert(decode("[[true, false], [false, true]]", true, &t, &e));
    ck_assert_int_eq(t.dtype, CODEC_BOOL);
    ck_assert(t.f32 == NULL);
    ck_assert(t.b8[0] == 1 && t.b8[1] == 0 && t.b8[2] == 0 && t.b8[3] == 1);
    codec_tensor_free(&t);

    ck_assert(decode("{\"shape\": [1, 3], \"data\": [true, true, false]}", true, &t, &e));
    ck_assert_int_eq(t.dtype, CODEC_BOOL);
    ck_assert(t.rank == 2 && t.shape[1] == 3 && t.b8[2] == 0 && t.b8[0] == 1);
    codec_tensor_free(&t);

    /* base64 of bytes 01 00 01 00 is "AQABAA==" */
    ck_assert(decode("{\"shape\": [2, 2], \"dtype\": \"bool\", \"base64\": \"AQABAA==\"}", true,
                     &t, &e));
    ck_assert_int_eq(t.dtype, CODEC_BOOL);
    ck_assert(t.b8[0] == 1 && t.b8[1] == 0 && t.b8[2] == 1 && t.b8[3] == 0);
    codec_tensor_free(&t);

    /* a numeric mask stays float32 */
    ck_assert(decode("[[0, -1e4]]", true, &t, &e));
    ck_assert_int_eq(t.dtype, CODEC_F32);
    ck_assert(t.f32[1] == -1e4f);
    codec_tensor_free(&t);

    expect_error("[[true, 1]]", true, 400, "wrong_type", "q");
    expect_error("[[1, false]]", true, 400, "wrong_type", "q");
    expect_error("[[true]]", false, 400, "wrong_type", "q");
    expect_error("{\"shape\": [1], \"dtype\": \"bool\", \"base64\": \"AQ==\"}", false, 400,
                 "wrong_type", "q.dtype");
    expect_error("{\"shape\": [2], \"dtype\": \"bool\", \"base64\": \"AQI=\"}", true, 422,
                 "invalid_value", "q.base64");
}
END_TEST

/* data that disagrees with its declared dtype is named as such, not as a
 * mix of numbers and booleans (there may be only one kind in it) */
START_TEST(decode_data_against_declared_dtype_says_so)
{
    static const char *const cases[][2] = {
        {"{\"shape\": [1], \"dtype\": \"bool\", \"data\": [1]}",
         "q.data[0] is a number but dtype is \"bool\""},
        {"{\"shape\": [2], \"dtype\": \"float32\", \"data\": [0, true]}",
         "q.data[1] is a boolean but dtype is \"float32\""},
        {"{\"shape\": [2], \"data\": [0, true]}", "q.data mixes numbers and booleans (at q.data[1])"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        expect_error(cases[i][0], true, 400, "wrong_type", "q.data");
        codec_tensor t;
        codec_error e;
        memset(&e, 0, sizeof e);
        ck_assert(!decode(cases[i][0], true, &t, &e));
        ck_assert_str_eq(e.message, cases[i][1]);
    }
}
END_TEST

START_TEST(decode_flat_form)
{
    codec_tensor t;
    codec_error e;
    ck_assert(decode("{\"data\": [1, 2, 3, 4, 5, 6], \"shape\": [2, 3]}", false, &t, &e));
    ck_assert(t.rank == 2 && t.shape[0] == 2 && t.shape[1] == 3 && t.count == 6);
    for (int i = 0; i < 6; i++)
        ck_assert(t.f32[i] == (float)(i + 1));
    codec_tensor_free(&t);
    /* 2.0 and 1e0 are integers too; an explicit float32 dtype is fine */
    ck_assert(decode("{\"shape\": [2.0, 1e0], \"dtype\": \"float32\", \"data\": [7, 8]}", false,
                     &t, &e));
    ck_assert(t.shape[0] == 2 && t.shape[1] == 1 && t.f32[1] == 8);
    codec_tensor_free(&t);
    /* zero-sized */
    ck_assert(decode("{\"shape\": [0, 4], \"data\": []}", false, &t, &e));
    ck_assert(t.rank == 2 && t.shape[0] == 0 && t.shape[1] == 4 && t.count == 0 && !t.f32);
    codec_tensor_free(&t);
}
END_TEST

START_TEST(decode_base64_form)
{
    /* float32 1.0 = 00 00 80 3f, -2.0 = 00 00 00 c0 little-endian:
     * base64 of 00 00 80 3f 00 00 00 c0 is "AACAPwAAAMA=" */
    codec_tensor t;
    codec_error e;
    ck_assert(decode("{\"shape\": [1, 2], \"dtype\": \"float32\", \"base64\": \"AACAPwAAAMA=\"}",
                     false, &t, &e));
    ck_assert(t.rank == 2 && t.shape[0] == 1 && t.shape[1] == 2);
    ck_assert(t.f32[0] == 1.0f && t.f32[1] == -2.0f);
    codec_tensor_free(&t);
    /* dtype defaults to float32; "\/" is a '/' */
    ck_assert(decode("{\"shape\": [1], \"base64\": \"AAB\\/Qw==\"}", false, &t, &e));
    uint32_t bits = 0x437f0000u; /* 255.0f */
    float f;
    memcpy(&f, &bits, 4);
    ck_assert(t.f32[0] == f);
    codec_tensor_free(&t);
    ck_assert(decode("{\"shape\": [0], \"base64\": \"\"}", false, &t, &e));
    ck_assert(t.count == 0 && t.f32 == NULL);
    codec_tensor_free(&t);
}
END_TEST

START_TEST(decode_empty_arrays_give_zero_dimensions)
{
    codec_tensor t;
    codec_error e;
    ck_assert(decode("[]", false, &t, &e));
    ck_assert(t.rank == 1 && t.shape[0] == 0 && t.count == 0 && !t.f32);
    codec_tensor_free(&t);
    ck_assert(decode("[[], []]", false, &t, &e));
    ck_assert(t.rank == 2 && t.shape[0] == 2 && t.shape[1] == 0 && t.count == 0);
    codec_tensor_free(&t);
    ck_assert(decode("[[[]]]", false, &t, &e));
    ck_assert(t.rank == 3 && t.shape[0] == 1 && t.shape[1] == 1 && t.shape[2] == 0);
    codec_tensor_free(&t);
    expect_error("[[], [1]]", false, 422, "ragged_array", "q");
    expect_error("[[[]], []]", false, 422, "ragged_array", "q");
}
END_TEST

START_TEST(decode_refuses_ragged_arrays)
{
    codec_tensor t;
    codec_error e;
    ck_assert(!decode("[[1,2,3,4],[1,2,3,4],[1,2,3,4],[1,2]]", false, &t, &e));
    ck_assert_int_eq(e.kind, CODEC_ERR_RAGGED);
    ck_assert_str_eq(e.field, "q");
    ck_assert_msg(strstr(e.message, "row 3 has 2 elements, expected 4"), "%s", e.message);
    expect_error("[[1,2],[3,4,5]]", false, 422, "ragged_array", "q");
    expect_error("[[1,2],3]", false, 422, "ragged_array", "q");
    expect_error("[1,[2]]", false, 422, "ragged_array", "q");
    expect_error("[[[1],[2]],[[3],[4,5]]]", false, 422, "ragged_array", "q");
    expect_error("[[[1],[2]],[[3]]]", false, 422, "ragged_array", "q");
    ck_assert(!decode("[[[1],[2]],[[3],[4,5]]]", false, &t, &e));
    ck_assert_msg(strstr(e.message, "q[1][1] has 2 elements, expected 1"), "%s", e.message);
}
END_TEST

START_TEST(decode_refuses_wrong_types)
{
    expect_error("5", false, 400, "wrong_type", "q");
    expect_error("\"abc\"", false, 400, "wrong_type", "q");
    expect_error("null", false, 400, "wrong_type", "q");
    expect_error("true", true, 400, "wrong_type", "q");
    expect_error("[[1, \"2\"]]", false, 400, "wrong_type", "q");
    expect_error("[[1, null]]", false, 400, "wrong_type", "q");
    expect_error("[[1, {}]]", false, 400, "wrong_type", "q");
    expect_error("[[[[[[[[[1]]]]]]]]]", false, 422, "invalid_shape", "q");
}
END_TEST

START_TEST(decode_refuses_numbers_not_finite_as_float32)
{
    codec_tensor t;
    codec_error e;
    ck_assert(!decode("[[1, 1e39]]", false, &t, &e));
    ck_assert_int_eq(e.kind, CODEC_ERR_NOT_FINITE);
    ck_assert_str_eq(e.field, "q");
    ck_assert_msg(strstr(e.message, "q[0][1]") && strstr(e.message, "1e39"), "%s", e.message);
    expect_error("[-3.5e38]", false, 400, "invalid_number", "q");
    expect_error("{\"shape\": [1], \"data\": [1e400]}", false, 400, "invalid_number", "q.data");
    /* 3.4028235e38 is FLT_MAX and fine */
    ck_assert(decode("[3.4028235e38, 1e-50]", false, &t, &e));
    ck_assert(t.f32[0] == FLT_MAX && t.f32[1] == 0.0f);
    codec_tensor_free(&t);
    /* base64 bit patterns of NaN and infinity: 00 00 c0 7f, 00 00 80 7f */
    expect_error("{\"shape\": [1], \"base64\": \"AADAfw==\"}", false, 400, "invalid_number",
                 "q.base64");
    expect_error("{\"shape\": [1], \"base64\": \"AACAfw==\"}", false, 400, "invalid_number",
                 "q.base64");
}
END_TEST

START_TEST(decode_object_form_errors)
{
    expect_error("{\"shape\": [2], \"data\": [1, 2], \"dtyp\": \"float32\"}", false, 400,
                 "unknown_field", "q.dtyp");
    expect_error("{\"shape\": [2], \"data\": [1, 2], \"shape\": [2]}", false, 400,
                 "duplicate_key", "q.shape");
    expect_error("{\"data\": [1, 2]}", false, 400, "missing_field", "q.shape");
    expect_error("{\"shape\": [2]}", false, 400, "missing_field", "q.data");
    expect_error("{\"shape\": [1], \"data\": [1], \"base64\": \"AACAPw==\"}", false, 400,
                 "unknown_field", "q.base64");
    expect_error("{\"shape\": 2, \"data\": [1, 2]}", false, 400, "wrong_type", "q.shape");
    expect_error("{\"shape\": [\"2\"], \"data\": [1, 2]}", false, 400, "wrong_type", "q.shape");
    expect_error("{\"shape\": [2.5], \"data\": [1, 2]}", false, 422, "invalid_shape", "q.shape");
    expect_error("{\"shape\": [-2], \"data\": [1, 2]}", false, 422, "invalid_shape", "q.shape");
    expect_error("{\"shape\": [1,1,1,1,1,1,1,1,1], \"data\": [1]}", false, 422, "invalid_shape",
                 "q.shape");
    expect_error("{\"shape\": [4611686018427387904, 4611686018427387904], \"data\": [1]}", false,
                 422, "invalid_shape", "q.shape");
    expect_error("{\"shape\": [2], \"data\": 1}", false, 400, "wrong_type", "q.data");
    expect_error("{\"shape\": [2], \"data\": [[1], [2]]}", false, 400, "wrong_type", "q.data");
    expect_error("{\"shape\": [1], \"dtype\": \"float64\", \"base64\": \"AAAAAAAA8D8=\"}", false,
                 400, "wrong_type", "q.dtype");
    expect_error("{\"shape\": [1], \"dtype\": 32, \"base64\": \"AACAPw==\"}", false, 400,
                 "wrong_type", "q.dtype");
    expect_error("{\"shape\": [1], \"base64\": 5}", false, 400, "wrong_type", "q.base64");

    codec_tensor t;
    codec_error e;
    ck_assert(!decode("{\"shape\": [2, 3], \"data\": [1, 2, 3, 4, 5]}", false, &t, &e));
    ck_assert_int_eq(e.kind, CODEC_ERR_SHAPE_MISMATCH);
    ck_assert_msg(strstr(e.message, "5") && strstr(e.message, "6") && strstr(e.message, "[2, 3]"),
                  "%s", e.message);
}
END_TEST

START_TEST(decode_base64_errors)
{
    /* length, alphabet, whitespace, padding */
    expect_error("{\"shape\": [1], \"base64\": \"AACAPw=\"}", false, 400, "invalid_base64",
                 "q.base64");
    expect_error("{\"shape\": [1], \"base64\": \"AAC*Pw==\"}", false, 400, "invalid_base64",
                 "q.base64");
    expect_error("{\"shape\": [1], \"base64\": \"AACA Pw==\"}", false, 400, "invalid_base64",
                 "q.base64");
    expect_error("{\"shape\": [1], \"base64\": \"AACAPw\\n==\"}", false, 400, "invalid_base64",
                 "q.base64");
    expect_error("{\"shape\": [1], \"base64\": \"AA=APw==\"}", false, 400, "invalid_base64",
                 "q.base64");
    expect_error("{\"shape\": [1], \"base64\": \"AACAPx==\"}", false, 400, "invalid_base64",
                 "q.base64"); /* non-zero padding bits */
    expect_error("{\"shape\": [1], \"base64\": \"AACA_w==\"}", false, 400, "invalid_base64",
                 "q.base64"); /* URL-safe alphabet */
    /* length against the shape: 2 floats given, 3 declared */
    codec_tensor t;
    codec_error e;
    ck_assert(!decode("{\"shape\": [3], \"base64\": \"AACAPwAAAMA=\"}", false, &t, &e));
    ck_assert_int_eq(e.kind, CODEC_ERR_SHAPE_MISMATCH);
    ck_assert_msg(strstr(e.message, "8 bytes") && strstr(e.message, "12"), "%s", e.message);
}
END_TEST

START_TEST(decode_checks_declared_shape_before_allocating)
{
    const char *s[] = {
        "{\"shape\": [1000000000, 1000000000], \"base64\": \"AACAPw==\"}",
        "{\"shape\": [1000000000, 1000000000], \"data\": [1, 2]}",
        "{\"shape\": [1000000000, 1000000000], \"dtype\": \"bool\", \"base64\": \"AQ==\"}",
    };
    for (int i = 0; i < 3; i++) {
        codec_tensor t;
        codec_error e;
        double t0 = now_s();
        ck_assert(!decode(s[i], true, &t, &e));
        /* A walk over 10^18 elements would take years: a second separates
         * that from a refusal by arithmetic even under valgrind (~50x
         * slower), where 10 ms did not. */
        ck_assert_msg(now_s() - t0 < 1.0, "took %.3f s", now_s() - t0);
        ck_assert_int_eq(e.kind, CODEC_ERR_SHAPE_MISMATCH);
    }
}
END_TEST

/* ================================================================ numbers */

/* Reads s as a number alone (its last byte the last readable one) and as
 * the first of a row with plenty of text after it (the reader's fast path
 * needs some), against (float)strtod. */
static void check_number(const char *s)
{
    float want = 0, got = 0;
    bool want_ok = ref_parse(s, &want);
    const char *stop;
    size_t len = strlen(s);
    bool ok = codec_parse_float(s, s + len, &stop, &got);
    CHECK(ok == want_ok, "%s: finite %d, want %d", s, ok, want_ok);
    CHECK(stop == s + len, "%s: stopped at %td", s, stop - s);
    CHECK(!ok || same_bits(got, want), "%s: got %a want %a", s, (double)got, (double)want);
    char row[1400];
    if (len + 80 > sizeof row)
        return;
    snprintf(row, sizeof row, "%s, 0.25, 1e-3, 123456789.123456789, 7]", s);
    ok = codec_parse_float(row, row + strlen(row), &stop, &got);
    CHECK(ok == want_ok, "%s in a row: finite %d, want %d", s, ok, want_ok);
    CHECK(stop == row + len, "%s in a row: stopped at %td", s, stop - row);
    CHECK(!ok || same_bits(got, want), "%s in a row: got %a want %a", s, (double)got,
          (double)want);
}

START_TEST(parse_number_edge_cases)
{
    struct {
        const char *s;
        bool ok;
        float v;
    } cases[] = {
        {"1e-46", true, 0.0f},
        {"-1e-46", true, -0.0f},
        {"3.4028235e38", true, FLT_MAX},
        {"-3.4028235e38", true, -FLT_MAX},
        {"3.4028236e38", false, 0},
        {"1e39", false, 0},
        {"-1e39", false, 0},
        {"-0", true, -0.0f},
        {"0", true, 0.0f},
        {"0.1", true, 0.1f},
        {"1e-400", true, 0.0f},
        {"1e400", false, 0},
        {"1.401298464324817e-45", true, 0x1p-149f},
        {"16777217", true, 16777216.0f},
        {"0.0000000000000000000000000000000000000000000000000000001e55", true, 1.0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *s = cases[i].s;
        float v = 12345;
        const char *stop;
        bool ok = codec_parse_float(s, s + strlen(s), &stop, &v);
        ck_assert_msg(ok == cases[i].ok, "%s", s);
        if (ok)
            ck_assert_msg(same_bits(v, cases[i].v), "%s: %a", s, (double)v);
        check_number(s);
    }
    /* Double rounding is part of the contract: this decimal is just above
     * the float32 midpoint 1 + 2^-24 but rounds to it as a double, and the
     * tie then goes to even (1.0); rounding once would give 1 + 2^-23. */
    const char *dr = "1.00000005960464477539062500000000001";
    float v;
    const char *stop;
    ck_assert(codec_parse_float(dr, dr + strlen(dr), &stop, &v));
    ck_assert(v == 1.0f);
    check_number(dr);
    /* long mantissas, huge exponents */
    const char *more[] = {"123456789012345678901234567890", "0.12345678913593292",
                          "3.40282356779733661637539395458142568447e38",
                          "3.4028235677973366e38", "1e-99999999999999999999",
                          "1e99999999999999999999", "-1e-99999999999999999999",
                          "7.006492321624085e-46", "7.0064923216240862e-46",
                          "2.2250738585072011e-308", "5e-324", "16777217.000000000000000000001"};
    for (size_t i = 0; i < sizeof more / sizeof *more; i++)
        check_number(more[i]);
    /* 1000 digits that sit exactly on a float32 midpoint until the last */
    char big[1200];
    int n = sprintf(big, "1.0000000596046447753906250");
    while (n < 1100)
        big[n++] = '0';
    big[n++] = '1';
    big[n] = 0;
    check_number(big);
    big[n - 1] = '0';
    check_number(big);
}
END_TEST

/* Where the reader's quick bracket cannot decide and the exact double is
 * needed: float32 midpoints written out in full and just off them, double
 * ties (a 54-bit odd significand: the tie then goes to even, before the
 * float32 rounding), and powers of ten at every exponent the table holds,
 * with 1 to 20 digits. */
START_TEST(parse_number_exact_where_rounding_is_close)
{
    char buf[160];
    uint64_t seed = 3;
    for (int i = 0; i < 20000; i++) {
        uint32_t b = (uint32_t)rng_next(&seed) & 0x7f7fffffu;
        float f, g;
        memcpy(&f, &b, 4);
        g = nextafterf(f, INFINITY);
        double mid = ((double)f + (double)g) / 2; /* exact: 25 bits */
        snprintf(buf, sizeof buf, "%.60g", mid);  /* exact decimal */
        check_number(buf);
        snprintf(buf, sizeof buf, "%.17g", nextafter(mid, 0));
        check_number(buf);
        snprintf(buf, sizeof buf, "%.17g", nextafter(mid, INFINITY));
        check_number(buf);
        /* the midpoint's digits, then one more non-zero one (and 19 or 20
         * significant digits in all) */
        snprintf(buf, sizeof buf, "%.18e", mid);
        char *e = strchr(buf, 'e');
        memmove(e + 1, e, strlen(e) + 1);
        *e = (char)('1' + i % 9);
        check_number(buf);
    }
    /* double ties: 2^53 + 1 and its company, written with negative
     * exponents too (the table's entry is then rounded down) */
    const char *ties[] = {"9007199254740993", "90071992547409930e-1", "900719925474099300e-2",
                          "9007199254740993.0", "0.9007199254740993e16", "9007199254740995",
                          "4503599627370497.5", "45035996273704975e-1", "18014398509481986",
                          "18014398509481990", "1.8014398509481986e16", "-9007199254740993",
                          "4503600164241407.5", "45036001642414075e-1"};
    for (size_t i = 0; i < sizeof ties / sizeof *ties; i++)
        check_number(ties[i]);
    /* double ties next to a float32 midpoint M between c (odd) and c + 1:
     * M - half a double unit is a tie that goes to M (even), which then
     * goes to c + 1; rounding the tie the other way would give c. Written
     * with at most 19 digits (M from 2^52 to 2^63), they reach the exact
     * double's hardest case. */
    for (int i = 0; i < 2000; i++) {
        uint64_t c = (rng_next(&seed) & 0x7fffffu) | 0x800001u; /* odd, 24 bits */
        int shift = 52 - 24 + (int)(rng_next(&seed) % 10);      /* M in [2^52, 2^62) */
        long double m = (long double)(2 * c + 1) * ldexpl(1.0L, shift - 1);
        long double half_unit = ldexpl(1.0L, shift + 24 - 53 - 1);
        for (int side = -1; side <= 1; side += 2) {
            snprintf(buf, sizeof buf, "%.1Lf", m + side * half_unit);
            check_number(buf);
            /* the same with the point moved: "...e-1" */
            char *dot = strchr(buf, '.');
            memmove(dot, dot + 1, strlen(dot));
            strcat(buf, "e-1");
            check_number(buf);
        }
    }
    for (int q = -70; q <= 45; q++) {
        const char *mantissas[] = {"1", "9", "5", "12345678", "999999999999999999",
                                   "9999999999999999999", "18446744073709551615",
                                   "12345678901234567890", "1.5", "0.000001"};
        for (size_t i = 0; i < sizeof mantissas / sizeof *mantissas; i++) {
            snprintf(buf, sizeof buf, "%se%d", mantissas[i], q);
            check_number(buf);
            snprintf(buf, sizeof buf, "-%se%d", mantissas[i], q);
            check_number(buf);
        }
    }
    /* float32 boundaries: the largest, the overflow point, the smallest */
    const char *edges[] = {"3.4028234663852886e38",  "3.4028235677973362e38",
                           "3.4028235677973366e38",  "3.402823567797336e38",
                           "340282356779733661637539395458142568448", "1.1754943508222875e-38",
                           "1.1754942106924411e-38", "1.401298464324817e-45",
                           "7.006492321624085e-46",  "7.006492321624086e-46",
                           "2.8025969286496341e-45", "4.2038953929744512e-45",
                           "0.00000000000000000000000000000000000000000000140129846432481707"};
    for (size_t i = 0; i < sizeof edges / sizeof *edges; i++)
        check_number(edges[i]);
}
END_TEST

/* ---- big integers for the checks below: little-endian 32-bit limbs */
typedef struct {
    uint32_t limb[40];
} big;

static void big_set(big *a, uint64_t hi, uint64_t lo)
{
    memset(a, 0, sizeof *a);
    a->limb[0] = (uint32_t)lo, a->limb[1] = (uint32_t)(lo >> 32);
    a->limb[2] = (uint32_t)hi, a->limb[3] = (uint32_t)(hi >> 32);
}

static void big_mul(big *a, uint32_t m)
{
    uint64_t carry = 0;
    for (int i = 0; i < 40; i++) {
        uint64_t x = (uint64_t)a->limb[i] * m + carry;
        a->limb[i] = (uint32_t)x;
        carry = x >> 32;
    }
    ck_assert(carry == 0);
}

static void big_add(big *a, const big *b)
{
    uint64_t carry = 0;
    for (int i = 0; i < 40; i++) {
        uint64_t x = (uint64_t)a->limb[i] + b->limb[i] + carry;
        a->limb[i] = (uint32_t)x;
        carry = x >> 32;
    }
}

static int big_cmp(const big *a, const big *b)
{
    for (int i = 39; i >= 0; i--)
        if (a->limb[i] != b->limb[i])
            return a->limb[i] < b->limb[i] ? -1 : 1;
    return 0;
}

static void big_pow2(big *a, int k)
{
    memset(a, 0, sizeof *a);
    a->limb[k / 32] = 1u << (k % 32);
}

/* Every entry of the reader's table of powers of ten: 10^q = M * 2^e
 * exactly for q >= 0, and M = floor(2^-e / 10^-q) below. */
START_TEST(pow10_table_entries_are_right)
{
    for (int q = POW10_Q_MIN; q <= POW10_Q_MAX; q++) {
        uint64_t hi = pow10_table[q - POW10_Q_MIN].hi, lo = pow10_table[q - POW10_Q_MIN].lo;
        int e = pow10_table[q - POW10_Q_MIN].e;
        ck_assert_msg(hi >> 63, "1e%d: not normalized", q);
        big m, ten;
        big_set(&m, hi, lo);
        big_set(&ten, 0, 1);
        for (int i = 0; i < (q < 0 ? -q : q); i++)
            big_mul(&ten, 10);
        if (q >= 0) { /* M = 10^q * 2^-e */
            ck_assert(e <= 0);
            for (int i = 0; i < -e; i++)
                big_mul(&ten, 2);
            ck_assert_msg(big_cmp(&m, &ten) == 0, "1e%d", q);
        } else { /* M * 10^n <= 2^-e < (M + 1) * 10^n */
            big lo_end = m, two;
            for (int i = 0; i < -q; i++)
                big_mul(&lo_end, 10);
            big_pow2(&two, -e);
            ck_assert_msg(big_cmp(&lo_end, &two) <= 0, "1e%d too large", q);
            big_add(&lo_end, &ten);
            ck_assert_msg(big_cmp(&lo_end, &two) > 0, "1e%d too small", q);
        }
    }
}
END_TEST

START_TEST(parse_number_matches_strtod_on_random_texts)
{
    uint64_t seed = 42;
    char buf[128];
    for (int i = 0; i < 400000; i++) {
        uint64_t r = rng_next(&seed);
        switch (r % 5) {
        case 0: { /* a float32 printed with 1..12 digits */
            uint32_t b = (uint32_t)(r >> 32);
            float f;
            memcpy(&f, &b, 4);
            if (!isfinite(f))
                continue;
            snprintf(buf, sizeof buf, "%.*g", (int)(rng_next(&seed) % 12 + 1), (double)f);
            break;
        }
        case 1: { /* a double as Python's float repr of a float32 would
                   * appear, or any double, with 17 digits */
            double d;
            uint64_t b = rng_next(&seed);
            memcpy(&d, &b, 8);
            if (!isfinite(d))
                continue;
            if (!(r & 1))
                d = (double)(float)d;
            if (!isfinite(d))
                continue;
            snprintf(buf, sizeof buf, "%.17g", d);
            break;
        }
        case 2: { /* random digit strings */
            int w = 0;
            if (r & 2)
                buf[w++] = '-';
            int nd = (int)(rng_next(&seed) % 25) + 1;
            buf[w++] = (char)('1' + rng_next(&seed) % 9);
            for (int k = 1; k < nd; k++)
                buf[w++] = (char)('0' + rng_next(&seed) % 10);
            if (r & 4) {
                buf[w++] = '.';
                int fd = (int)(rng_next(&seed) % 20) + 1;
                for (int k = 0; k < fd; k++)
                    buf[w++] = (char)('0' + rng_next(&seed) % 10);
            }
            if (r & 8)
                w += sprintf(buf + w, "e%d", (int)(rng_next(&seed) % 100) - 60);
            buf[w] = 0;
            break;
        }
        case 3: { /* next to a float32 midpoint (where double rounding bites) */
            uint32_t b = (uint32_t)(r >> 32) & 0x7f7fffffu;
            float f, g;
            memcpy(&f, &b, 4);
            g = nextafterf(f, INFINITY);
            double mid = ((double)f + (double)g) / 2;
            double near = (r & 16) ? mid : nextafter(mid, (r & 32) ? 0 : INFINITY);
            snprintf(buf, sizeof buf, "%.*g", (int)(rng_next(&seed) % 10) + 12, near);
            break;
        }
        default: /* what numpy clients send: 0.123456789 */
            snprintf(buf, sizeof buf, "%.9f", ((double)(r >> 11) * 0x1p-53 - 0.5) * 4);
            break;
        }
        check_number(buf);
    }
}
END_TEST

/* ============================================================ formatting */

static int significant_digits(const char *s)
{
    int n = 0, last = 0;
    bool started = false;
    for (; *s && *s != 'e'; s++) {
        if (*s < '0' || *s > '9')
            continue;
        if (*s != '0')
            started = true;
        if (started) {
            n++;
            if (*s != '0')
                last = n;
        }
    }
    return last ? last : 1;
}

static char *float_text(float f, char *buf)
{
    char *e = codec_float_text(f, buf);
    *e = 0;
    return buf;
}

START_TEST(float_text_examples)
{
    char b[CODEC_FLOAT_TEXT_MAX + 1];
    ck_assert_str_eq(float_text(0.1f, b), "0.1");
    ck_assert_str_eq(float_text(1e-7f, b), "1e-07");
    ck_assert_str_eq(float_text(3.0f, b), "3.0");
    ck_assert_str_eq(float_text(-0.0f, b), "-0.0");
    ck_assert_str_eq(float_text(0.0f, b), "0.0");
    ck_assert_str_eq(float_text(-2.5f, b), "-2.5");
    ck_assert_str_eq(float_text(FLT_MAX, b), "3.4028235e+38");
    ck_assert_str_eq(float_text(0x1p-149f, b), "1e-45");
    ck_assert_str_eq(float_text(16777216.0f, b), "16777216.0");
    ck_assert_str_eq(float_text(-1e15f, b), "-1000000000000000.0");
    ck_assert_str_eq(float_text(-0.00012345678f, b), "-0.00012345678");
    ck_assert_str_eq(float_text(-1.1754942e-38f, b), "-1.1754942e-38");
    ck_assert_str_eq(float_text(1e16f, b), "1e+16");
    ck_assert_str_eq(float_text(0.0001f, b), "0.0001");
    ck_assert_str_eq(float_text(NAN, b), "null");
    ck_assert_str_eq(float_text(-INFINITY, b), "null");
    codec_buf buf = {0};
    codec_buf_float(&buf, 0.3f);
    codec_buf_float(&buf, INFINITY);
    ck_assert_str_eq(buf.data, "0.3null");
    codec_buf_free(&buf);
}
END_TEST

START_TEST(float_text_round_trips_every_kind_of_float)
{
    uint64_t seed = 7;
    char b[CODEC_FLOAT_TEXT_MAX + 1];
    for (int i = 0; i < 1200000; i++) {
        uint32_t bits = (uint32_t)rng_next(&seed);
        if (i < 2000) /* subnormals and the smallest normals */
            bits = (bits & 0x80000000u) | (bits % 0x01000000u);
        float f;
        memcpy(&f, &bits, 4);
        if (!isfinite(f))
            continue;
        char fenced_buf[CODEC_FLOAT_TEXT_MAX + 16];
        memset(fenced_buf, 0x55, sizeof fenced_buf);
        char *e = codec_float_text(f, fenced_buf);
        for (size_t k = CODEC_FLOAT_TEXT_MAX; k < sizeof fenced_buf; k++)
            CHECK(fenced_buf[k] == 0x55, "%a wrote past CODEC_FLOAT_TEXT_MAX", (double)f);
        CHECK(e - fenced_buf <= 19, "%a: text too long", (double)f);
        float_text(f, b);
        CHECK(strncmp(b, fenced_buf, (size_t)(e - fenced_buf)) == 0, "%a", (double)f);
        float back;
        CHECK(ref_parse(b, &back) && same_bits(back, f), "%a -> %s", (double)f, b);
        /* and by a reader that rounds once, straight to float32 */
        CHECK(same_bits(strtof(b, NULL), f), "%a -> %s, which strtof reads as %a", (double)f, b,
              (double)strtof(b, NULL));
        const char *stop;
        float mine;
        CHECK(codec_parse_float(b, b + strlen(b), &stop, &mine) && same_bits(mine, f), "%s", b);
        if (i % 1000 == 0)
            CHECK(valid(b), "%s is not JSON", b);
    }
}
END_TEST

START_TEST(float_text_is_shortest)
{
    uint64_t seed = 11;
    char b[CODEC_FLOAT_TEXT_MAX + 1], g[64];
    for (int i = 0; i < 200000; i++) {
        uint32_t bits = (uint32_t)rng_next(&seed);
        float f;
        if (i % 2)
            f = (float)((double)(bits % 2000001) / 1000.0 - 1000.0); /* short decimals */
        else
            memcpy(&f, &bits, 4);
        if (!isfinite(f) || f == 0)
            continue;
        int p;
        for (p = 1; p <= 9; p++) {
            snprintf(g, sizeof g, "%.*g", p, (double)f);
            float back;
            if (ref_parse(g, &back) && same_bits(back, f))
                break;
        }
        float_text(f, b);
        CHECK(significant_digits(b) <= p, "%s for %s (%d digits)", b, g, p);
    }
}
END_TEST

/* Shortest and nearest, by glibc's correctly rounded printf (see
 * tests/support/float_check.h). */
static void check_shortest_and_nearest(float f)
{
    char text[CODEC_FLOAT_TEXT_MAX + 1], why[128];
    float_text(fabsf(f), text);
    const char *wrong = float_check_shortest_nearest(fabsf(f), text, why, sizeof why);
    CHECK(!wrong, "%s for %a: %s", text, (double)f, wrong);
}

START_TEST(float_text_is_shortest_and_nearest)
{
    uint64_t seed = 5;
    for (int i = 0; i < 300000; i++) {
        uint32_t bits = (uint32_t)rng_next(&seed);
        if (i % 4 == 0) /* subnormals and the smallest normals */
            bits = (bits & 0x80000000u) | (bits % 0x01800000u);
        float f;
        memcpy(&f, &bits, 4);
        if (isfinite(f) && f != 0)
            check_shortest_and_nearest(f);
    }
    /* powers of two (the gap below is half the gap above), powers of ten
     * and their neighbours, the extremes */
    for (int e = -149; e <= 127; e++) {
        float p = ldexpf(1.0f, e);
        check_shortest_and_nearest(p);
        check_shortest_and_nearest(nextafterf(p, 0));
        check_shortest_and_nearest(nextafterf(p, INFINITY));
    }
    for (int e = -45; e <= 38; e++) {
        float p = (float)pow(10.0, e);
        check_shortest_and_nearest(p);
        check_shortest_and_nearest(nextafterf(p, 0));
        check_shortest_and_nearest(nextafterf(p, INFINITY));
    }
    check_shortest_and_nearest(FLT_MAX);
    check_shortest_and_nearest(FLT_MIN);
    check_shortest_and_nearest(0x1p-149f);
}
END_TEST

/* ============================================================ tensors out */

START_TEST(encode_forms_exact_text)
{
    float x[6] = {1, 0.5f, -2, 0.1f, 1e-7f, 3};
    int64_t shape[2] = {2, 3};
    char *s = encode_text(x, 2, shape, CODEC_ENC_NESTED);
    ck_assert_str_eq(s, "[[1.0,0.5,-2.0],[0.1,1e-07,3.0]]");
    free(s);
    s = encode_text(x, 2, shape, CODEC_ENC_FLAT);
    ck_assert_str_eq(s, "{\"shape\":[2,3],\"data\":[1.0,0.5,-2.0,0.1,1e-07,3.0]}");
    free(s);
    float y[2] = {1.0f, -2.0f};
    int64_t s2[2] = {1, 2};
    s = encode_text(y, 2, s2, CODEC_ENC_BASE64);
    ck_assert_str_eq(s, "{\"shape\":[1,2],\"dtype\":\"float32\",\"base64\":\"AACAPwAAAMA=\"}");
    free(s);
    int64_t z[3] = {2, 0, 3};
    s = encode_text(NULL, 3, z, CODEC_ENC_NESTED);
    ck_assert_str_eq(s, "[[],[]]");
    free(s);
    s = encode_text(NULL, 3, z, CODEC_ENC_FLAT);
    ck_assert_str_eq(s, "{\"shape\":[2,0,3],\"data\":[]}");
    free(s);
    s = encode_text(NULL, 3, z, CODEC_ENC_BASE64);
    ck_assert_str_eq(s, "{\"shape\":[2,0,3],\"dtype\":\"float32\",\"base64\":\"\"}");
    free(s);
    float nan[2] = {NAN, 1};
    int64_t s1[1] = {2};
    s = encode_text(nan, 1, s1, CODEC_ENC_NESTED);
    ck_assert_str_eq(s, "[null,1.0]");
    free(s);
}
END_TEST

START_TEST(encode_decode_round_trip_bit_exact)
{
    uint64_t seed = 3;
    for (int iter = 0; iter < 60; iter++) {
        int rank = 1 + iter % 4;
        int64_t shape[4], count = 1;
        for (int i = 0; i < rank; i++) {
            shape[i] = 1 + (int64_t)(rng_next(&seed) % (rank > 2 ? 5 : 40));
            count *= shape[i];
        }
        float *x = malloc((size_t)count * sizeof(float));
        for (int64_t i = 0; i < count; i++) {
            uint32_t b = (uint32_t)rng_next(&seed);
            if (iter % 3 == 0) /* any finite bit pattern, subnormals included */
                b &= 0xff7fffffu;
            memcpy(&x[i], &b, 4);
            if (iter % 3 != 0)
                x[i] = (float)((double)(b >> 8) * 0x1p-24 * 2 - 1);
        }
        for (int enc = 0; enc < 3; enc++) {
            char *s = encode_text(x, rank, shape, (codec_encoding)enc);
            codec_error e;
            ck_assert_msg(codec_validate(s, strlen(s), &e), "%s", e.message);
            codec_tensor t;
            ck_assert_msg(codec_tensor_decode(s, s + strlen(s), "q", false, &t, &e), "%s",
                          e.message);
            ck_assert_int_eq(t.rank, rank);
            for (int i = 0; i < rank; i++)
                ck_assert_int_eq(t.shape[i], shape[i]);
            ck_assert_int_eq(t.count, count);
            ck_assert(memcmp(t.f32, x, (size_t)count * 4) == 0);
            codec_tensor_free(&t);
            /* jansson reads what we write */
            json_error_t je;
            json_t *j = json_loads(s, JSON_DECODE_ANY, &je);
            ck_assert_msg(j != NULL, "%s", je.text);
            json_decref(j);
            free(s);
        }
        free(x);
    }
}
END_TEST

/* ============================================================== strings */

/* The reference UTF-8 reader: decode the bits naively, then accept only if
 * the canonical encoding of that code point (written by hand here) is the
 * same bytes and the code point is a scalar value. */
static size_t ref_encode_utf8(uint32_t cp, unsigned char *out)
{
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xc0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 63));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xe0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | (cp >> 6 & 63));
        out[2] = (unsigned char)(0x80 | (cp & 63));
        return 3;
    }
    out[0] = (unsigned char)(0xf0 | cp >> 18);
    out[1] = (unsigned char)(0x80 | (cp >> 12 & 63));
    out[2] = (unsigned char)(0x80 | (cp >> 6 & 63));
    out[3] = (unsigned char)(0x80 | (cp & 63));
    return 4;
}

/* Length of the valid sequence at s (n bytes available), 0 if none; the
 * code point in *cp. */
static size_t ref_utf8(const unsigned char *s, size_t n, uint32_t *cp)
{
    size_t len = s[0] < 0x80 ? 1 : s[0] >> 5 == 6 ? 2 : s[0] >> 4 == 14 ? 3 : s[0] >> 3 == 30 ? 4 : 0;
    if (len == 0 || len > n)
        return 0;
    uint32_t c = len == 1 ? s[0] : s[0] & (0xffu >> (len + 1));
    for (size_t i = 1; i < len; i++)
        c = c << 6 | (s[i] & 63u);
    unsigned char canon[4];
    if (c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff) || ref_encode_utf8(c, canon) != len ||
        memcmp(canon, s, len) != 0)
        return 0;
    *cp = c;
    return len;
}

START_TEST(utf8_sequence_matches_reference_on_every_short_input)
{
    unsigned char b[4];
    uint32_t cp;
    /* every 1-, 2- and 3-byte input */
    for (uint32_t x = 0; x < (1u << 24); x++) {
        b[0] = (unsigned char)(x >> 16), b[1] = (unsigned char)(x >> 8), b[2] = (unsigned char)x;
        size_t want = ref_utf8(b, 3, &cp);
        size_t got = codec_utf8_sequence(b, 3);
        CHECK(got == want, "%02x %02x %02x: %zu, want %zu", b[0], b[1], b[2], got, want);
        if (x < (1u << 16)) {
            b[0] = (unsigned char)(x >> 8), b[1] = (unsigned char)x;
            CHECK(codec_utf8_sequence(b, 2) == ref_utf8(b, 2, &cp), "%02x %02x", b[0], b[1]);
            CHECK(codec_utf8_sequence(b, 1) == ref_utf8(b, 1, &cp), "%02x alone", b[0]);
        }
    }
    /* 4-byte inputs: every lead and second byte, the edges of the rest */
    const unsigned char edges[] = {0x00, 0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xff};
    for (unsigned lead = 0xf0; lead <= 0xff; lead++)
        for (unsigned second = 0; second < 256; second++)
            for (size_t i = 0; i < sizeof edges; i++)
                for (size_t j = 0; j < sizeof edges; j++) {
                    b[0] = (unsigned char)lead, b[1] = (unsigned char)second;
                    b[2] = edges[i], b[3] = edges[j];
                    size_t want = ref_utf8(b, 4, &cp);
                    CHECK(codec_utf8_sequence(b, 4) == want, "%02x %02x %02x %02x", b[0], b[1],
                          b[2], b[3]);
                }
    /* every scalar value's encoding is valid, every surrogate's is not */
    for (uint32_t c = 0; c <= 0x10ffff; c++) {
        size_t n = ref_encode_utf8(c, b);
        bool want = c < 0xd800 || c > 0xdfff;
        CHECK(codec_utf8_valid((const char *)b, n) == want, "U+%04X", c);
    }
}
END_TEST

START_TEST(utf8_valid_and_uncut_on_texts)
{
    ck_assert(codec_utf8_valid("", 0));
    ck_assert(codec_utf8_valid("a\0b", 3)); /* NUL is a character */
    ck_assert(codec_utf8_valid("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9));
    ck_assert(!codec_utf8_valid("\xc3", 1));
    ck_assert(!codec_utf8_valid("\xc0\xaf", 2));         /* overlong '/' */
    ck_assert(!codec_utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
    ck_assert(!codec_utf8_valid("\xf4\x90\x80\x80", 4)); /* above U+10FFFF */
    ck_assert(!codec_utf8_valid("a\x80", 2));
    /* uncut drops only a sequence cut short at the very end */
    ck_assert_uint_eq(codec_utf8_uncut("ab\xc3\xa9", 4), 4);
    ck_assert_uint_eq(codec_utf8_uncut("ab\xc3\xa9", 3), 2);
    ck_assert_uint_eq(codec_utf8_uncut("ab\xe2\x82\xac", 4), 2);
    ck_assert_uint_eq(codec_utf8_uncut("ab\xe2\x82\xac", 3), 2);
    ck_assert_uint_eq(codec_utf8_uncut("ab\xf0\x9f\x98\x80", 5), 2);
    ck_assert_uint_eq(codec_utf8_uncut("ab\xf0\x9f\x98\x80", 6), 6);
    ck_assert_uint_eq(codec_utf8_uncut("ab\x80", 3), 3); /* a stray byte is not a cut */
    ck_assert_uint_eq(codec_utf8_uncut("", 0), 0);
}
END_TEST

/* What the escaped text of s must read back as: s with every byte that
 * starts no valid sequence replaced by U+FFFD. */
static size_t ref_unescaped(const unsigned char *s, size_t n, char *out)
{
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = ref_utf8(s + i, n - i, &cp);
        if (k == 0) {
            memcpy(out + w, "\xef\xbf\xbd", 3);
            w += 3;
            i++;
        } else {
            memcpy(out + w, s + i, k);
            w += k;
            i += k;
        }
    }
    return w;
}

START_TEST(escape_text_reads_back_as_the_text_for_any_bytes)
{
    uint64_t seed = 7;
    static const unsigned char pool[] = {'a', 'Z', ' ', '"', '\\', '/', 0, '\n', '\t', 0x1f,
                                         0x7f, 0xc3, 0xa9, 0xe2, 0x80, 0xa8, 0xf0, 0x9f,
                                         0x98, 0xed, 0xa0, 0xff, 0xc0, 0xbf};
    for (int iter = 0; iter < 5000; iter++) {
        unsigned char in[40];
        size_t n = rng_next(&seed) % sizeof in;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = rng_next(&seed);
            in[i] = r & 1 ? pool[(r >> 1) % sizeof pool] : (unsigned char)(r >> 8);
        }
        for (unsigned flags = 0; flags <= CODEC_ESCAPE_ASCII; flags++) {
            char out[CODEC_ESCAPED_MAX(sizeof in) + 3];
            out[0] = '"';
            size_t len = codec_escape_text(out + 1, sizeof out - 2, (const char *)in, n, flags);
            CHECK(len <= CODEC_ESCAPED_MAX(n), "escaped length %zu of %zu bytes", len, n);
            out[1 + len] = '"';
            json_error_t je;
            json_t *j = json_loadb(out, len + 2, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            CHECK(j != NULL && json_is_string(j), "not a JSON string: %s (%s)", out, je.text);
            char want[sizeof in * 3];
            size_t wn = ref_unescaped(in, n, want);
            CHECK(json_string_length(j) == wn && memcmp(json_string_value(j), want, wn) == 0,
                  "reads back wrong: %s", out);
            json_decref(j);
            for (size_t i = 1; i <= len; i++) {
                unsigned char c = (unsigned char)out[i];
                CHECK(c >= 0x20 && c != 0x7f, "control byte %02x left in %s", c, out);
                CHECK(!(flags & CODEC_ESCAPE_ASCII) || c < 0x80, "non-ASCII in %s", out);
            }
            CHECK(strstr(out, "\xe2\x80\xa8") == NULL, "U+2028 left raw in %s", out);
            /* cut short: a prefix of the whole, ending between escapes */
            for (size_t cap = 0; cap <= len + 1; cap++) {
                char cut[sizeof out];
                memset(cut, '#', sizeof cut);
                size_t need = codec_escape_text(cut + 1, cap, (const char *)in, n, flags);
                CHECK(need == len, "cap %zu: needs %zu, want %zu", cap, need, len);
                if (cap == 0) {
                    CHECK(cut[1] == '#', "cap 0 wrote");
                    continue;
                }
                size_t w = strlen(cut + 1);
                CHECK(w < cap && memcmp(cut + 1, out + 1, w) == 0, "cap %zu: not a prefix", cap);
                cut[0] = '"';
                cut[1 + w] = '"';
                j = json_loadb(cut, w + 2, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
                CHECK(j != NULL, "cap %zu: cut inside an escape: %.*s", cap, (int)w + 2, cut);
                json_decref(j);
            }
        }
    }
}
END_TEST

START_TEST(escape_text_examples)
{
    char out[64];
    ck_assert_uint_eq(codec_escape_text(out, sizeof out, "q\0x", 3, 0), 8);
    ck_assert_str_eq(out, "q\\u0000x");
    codec_escape_text(out, sizeof out, "a\"b\\c\n\t\b\f\r\x01\x7f", 12, 0);
    ck_assert_str_eq(out, "a\\\"b\\\\c\\n\\t\\b\\f\\r\\u0001\\u007f");
    codec_escape_text(out, sizeof out, "\xc3\xa9\xf0\x9f\x98\x80/", 7, 0);
    ck_assert_str_eq(out, "\xc3\xa9\xf0\x9f\x98\x80/");
    codec_escape_text(out, sizeof out, "\xc3\xa9\xf0\x9f\x98\x80", 6, CODEC_ESCAPE_ASCII);
    ck_assert_str_eq(out, "\\u00e9\\ud83d\\ude00");
    codec_escape_text(out, sizeof out, "\xc0\xaf\xe2\x80\xa9", 5, 0);
    ck_assert_str_eq(out, "\xef\xbf\xbd\xef\xbf\xbd\\u2029");
    /* a cut never splits a character or an escape */
    ck_assert_uint_eq(codec_escape_text(out, 5, "ab\xc3\xa9z", 5, 0), 5);
    ck_assert_str_eq(out, "ab\xc3\xa9");
    ck_assert_uint_eq(codec_escape_text(out, 4, "ab\xc3\xa9z", 5, 0), 5);
    ck_assert_str_eq(out, "ab");
    ck_assert_uint_eq(codec_escape_text(out, 7, "ab\n\x01", 4, 0), 10);
    ck_assert_str_eq(out, "ab\\n");
}
END_TEST

/* ======================================================= classes of error */

/* Every 400 (a wrong type, a number not finite, text that is not base64)
 * before any 422 (a shape that does not fit): the class does not depend on
 * which of two faults comes first in the text. */
START_TEST(decode_type_errors_come_before_shape_errors)
{
    /* a non-number where a row belongs: the type decides */
    expect_error("[[1],null]", false, 400, "wrong_type", "q");
    expect_error("[[1],\"a\"]", false, 400, "wrong_type", "q");
    expect_error("[[1],{}]", false, 400, "wrong_type", "q");
    expect_error("[[1],true]", false, 400, "wrong_type", "q");
    expect_error("[[1],false]", true, 400, "wrong_type", "q"); /* mixes in a mask */
    expect_error("[null,[1]]", false, 400, "wrong_type", "q");
    /* a ragged row first, a wrong type after it */
    expect_error("[[1,2],[3],[\"x\",4]]", false, 400, "wrong_type", "q");
    expect_error("[[1,2],[3],[1e39,4]]", false, 400, "invalid_number", "q");
    expect_error("[[[1]],[2],[[null]]]", false, 400, "wrong_type", "q");
    expect_error("[[true],[false,true],[1]]", true, 400, "wrong_type", "q");
    expect_error("[[[[[[[[[\"deep\"]]]]]]]]]", false, 400, "wrong_type", "q");
    /* only shape faults: still a 422 */
    expect_error("[[1],2]", false, 422, "ragged_array", "q");
    expect_error("[[1,2],[3]]", false, 422, "ragged_array", "q");
    expect_error("[1,[2]]", false, 422, "ragged_array", "q");
    expect_error("[[[[[[[[[1]]]]]]]]]", false, 422, "invalid_shape", "q");
    expect_error("[[true],[false,true]]", true, 422, "ragged_array", "q");
    /* base64: the text first, then the values, then the shape */
    expect_error("{\"shape\":[2],\"base64\":\"!!!!\"}", false, 400, "invalid_base64", "q.base64");
    expect_error("{\"shape\":[2],\"base64\":\"AA=A\"}", false, 400, "invalid_base64", "q.base64");
    expect_error("{\"shape\":[5],\"base64\":\"AAAA=AAA\"}", false, 400, "invalid_base64", "q.base64");
    expect_error("{\"shape\":[-1],\"base64\":\"!!!!\"}", false, 400, "invalid_base64", "q.base64");
    expect_error("{\"shape\":[2.5],\"base64\":\"AA=A\"}", false, 400, "invalid_base64", "q.base64");
    expect_error("{\"shape\":[3],\"base64\":\"AACAfw==\"}", false, 400, "invalid_number", "q.base64");
    expect_error("{\"shape\":[-1],\"base64\":\"AACAPw==\"}", false, 422, "invalid_shape", "q.shape");
    expect_error("{\"shape\":[3],\"base64\":\"AACAPw==\"}", false, 422, "shape_mismatch", "q.base64");
    expect_error("{\"shape\":[2],\"dtype\":\"bool\",\"base64\":\"AgE=\"}", true, 422, "invalid_value", "q.base64");
    expect_error("{\"shape\":[3],\"dtype\":\"bool\",\"base64\":\"AgE=\"}", true, 422, "shape_mismatch", "q.base64");
    /* flat data: its elements first, then the shape */
    expect_error("{\"shape\":[3],\"data\":[1,null]}", false, 400, "wrong_type", "q.data");
    expect_error("{\"shape\":[-3],\"data\":[1,\"x\"]}", false, 400, "wrong_type", "q.data");
    expect_error("{\"shape\":[-3],\"data\":[1,2]}", false, 422, "invalid_shape", "q.shape");
    expect_error("{\"shape\":[\"2\"],\"data\":[1,2]}", false, 400, "wrong_type", "q.shape");
    expect_error("{\"shape\":[3],\"data\":[1,2]}", false, 422, "shape_mismatch", "q.data");
}
END_TEST

/* Keys are quoted in messages as JSON writes them: an escaped NUL shows
 * as \u0000 and the rest of the key follows it. */
START_TEST(messages_quote_keys_whole_and_escaped)
{
    codec_error e;
    codec_member m[4];
    size_t n;
    const char *dup = "{\"a\\u0000b\":1,\"a\\u0000b\":2}";
    ck_assert(valid(dup));
    ck_assert(!codec_members(dup, dup + strlen(dup), m, 4, &n, "", &e));
    ck_assert_int_eq(e.kind, CODEC_ERR_DUPLICATE_KEY);
    ck_assert_msg(strstr(e.message, "\"a\\u0000b\"") != NULL, "%s", e.message);
    const char *key = "{\"shape\":[1],\"data\":[1],\"x\\u0000y\\\"z\":1}";
    expect_error(key, false, 400, "unknown_field", "q....");
    codec_tensor t;
    ck_assert(!decode(key, false, &t, &e));
    ck_assert_msg(strstr(e.message, "\"x\\u0000y\\\"z\"") != NULL, "%s", e.message);
    /* a long key is cut at a character, with "..." */
    char longkey[400];
    int w = sprintf(longkey, "{\"");
    for (int i = 0; i < 100; i++)
        w += sprintf(longkey + w, "\xc3\xa9");
    sprintf(longkey + w, "\":1,\"shape\":[1],\"data\":[1]}");
    ck_assert(!decode(longkey, false, &t, &e));
    ck_assert_int_eq(e.kind, CODEC_ERR_UNKNOWN_MEMBER);
    char *dots = strstr(e.message, "...\"");
    ck_assert_msg(dots != NULL, "%s", e.message);
    ck_assert_msg((unsigned char)dots[-1] == 0xa9 && (unsigned char)dots[-2] == 0xc3, "%s", e.message);
}
END_TEST

/* ======================================================== half precision */

/* The references, from the definitions: a float16 is (-1)^s 2^(e-15)
 * (1 + m/1024), or m 2^-24 when e = 0; a bfloat16 is (-1)^s 2^(e-127)
 * (1 + m/128), or m 2^-133. Rounding to them: the value in units of the
 * grid where it lies, rounded by nearbyint (ties to even). */
static float ref_from_half(uint16_t h, bool bf16)
{
    int ebits = bf16 ? 8 : 5, mbits = bf16 ? 7 : 10, bias = bf16 ? 127 : 15;
    unsigned e = (h >> mbits) & ((1u << ebits) - 1), m = h & ((1u << mbits) - 1);
    double sign = h & 0x8000 ? -1.0 : 1.0;
    if (e == (1u << ebits) - 1)
        return m ? NAN : (float)(sign * INFINITY);
    if (e == 0)
        return (float)(sign * ldexp(m, 1 - bias - mbits));
    return (float)(sign * ldexp(1.0 + ldexp(m, -mbits), (int)e - bias));
}

static uint16_t ref_to_half(float f, bool bf16)
{
    int mbits = bf16 ? 7 : 10, bias = bf16 ? 127 : 15, emax = bf16 ? 127 : 15;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    int e;
    frexp(a, &e); /* a = frac * 2^e, frac in [0.5, 1) */
    e -= 1;       /* a in [2^e, 2^(e+1)) */
    if (e < 1 - bias)
        e = 1 - bias; /* subnormal grid */
    double unit = ldexp(1.0, e - mbits);
    double q = nearbyint(a / unit) * unit; /* a / unit is exact: 24 bits */
    if (q >= ldexp(1.0, emax + 1))
        return sign | (uint16_t)(((1u << (bf16 ? 8 : 5)) - 1) << mbits); /* infinity */
    /* the bits of q: find them by comparing with ref_from_half */
    int qe;
    frexp(q, &qe);
    qe -= 1;
    if (q == 0)
        return sign;
    if (qe < 1 - bias) /* subnormal */
        return sign | (uint16_t)(q / ldexp(1.0, 1 - bias - mbits));
    unsigned m = (unsigned)((q / ldexp(1.0, qe) - 1.0) * (1u << mbits));
    return sign | (uint16_t)((unsigned)(qe + bias) << mbits | m);
}

static const char *const PATH_NAME[] = {"portable", "f16c", "avx512", "avx512_bf16"};

START_TEST(half_widening_exact_for_every_pattern_and_path)
{
    uint8_t in[2 * 65536];
    for (unsigned h = 0; h < 65536; h++)
        in[2 * h] = (uint8_t)h, in[2 * h + 1] = (uint8_t)(h >> 8);
    static float out[65536];
    int paths = 0;
    for (codec_half_path p = CODEC_HALF_PORTABLE; p <= CODEC_HALF_AVX512_BF16; p++) {
        if (!codec_half_path_supported(p)) {
            printf("half precision: the %s path is not supported by this CPU; skipped\n",
                   PATH_NAME[p]);
            continue;
        }
        paths++;
        for (int bf = 0; bf <= 1; bf++) {
            codec_dtype dt = bf ? CODEC_BF16 : CODEC_F16;
            /* odd lengths and offsets reach every tail */
            codec_half_to_f32(dt, in, out, 65536, p);
            codec_half_to_f32(dt, in + 2, out + 1, 7, p);
            for (unsigned h = 0; h < 65536; h++) {
                float want = ref_from_half((uint16_t)h, bf);
                CHECK(isnan(want) ? isnan(out[h]) : same_bits(out[h], want),
                      "%s %s %04x: %a, want %a", PATH_NAME[p], bf ? "bf16" : "f16", h,
                      (double)out[h], (double)want);
                /* and back, exactly */
                if (!isnan(want)) {
                    uint16_t back = bf ? codec_f32_to_bf16_one(want) : codec_f32_to_f16_one(want);
                    CHECK(back == h, "%04x -> %a -> %04x", h, (double)want, back);
                }
            }
        }
    }
    ck_assert_int_ge(paths, 1);
}
END_TEST

START_TEST(half_narrowing_rounds_to_nearest_even_on_every_path)
{
    /* every float32 whose low bits sit at a rounding case for float16
     * (13 bits dropped) or bfloat16 (16 dropped): exact, just below, on
     * and just above the tie; all exponents and signs */
    static const uint32_t low16[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000,
                                     0x7fff, 0x8000, 0x8001, 0xffff, 0x3000, 0x5fff, 0xa000};
    enum { N = 65536 * (sizeof low16 / sizeof *low16) };
    float *x = malloc(N * sizeof(float));
    uint8_t *out = malloc(2 * N), *portable = malloc(2 * N);
    ck_assert(x && out && portable);
    size_t n = 0;
    for (uint32_t hi = 0; hi < 65536; hi++)
        for (size_t k = 0; k < sizeof low16 / sizeof *low16; k++) {
            uint32_t u = hi << 16 | low16[k];
            memcpy(&x[n++], &u, 4);
        }
    for (int bf = 0; bf <= 1; bf++) {
        codec_dtype dt = bf ? CODEC_BF16 : CODEC_F16;
        codec_f32_to_half(dt, x, portable, n, CODEC_HALF_PORTABLE);
        for (size_t i = 0; i < n; i++) {
            uint16_t got = (uint16_t)(portable[2 * i] | portable[2 * i + 1] << 8);
            if (isnan(x[i])) {
                CHECK(isnan(ref_from_half(got, bf)), "NaN %a became %04x", (double)x[i], got);
                continue;
            }
            uint16_t want = ref_to_half(x[i], bf);
            uint32_t bits;
            memcpy(&bits, &x[i], 4);
            CHECK(got == want, "%s %08x (%a): %04x, want %04x", bf ? "bf16" : "f16",
                  (unsigned)bits, (double)x[i], got, want);
        }
        for (codec_half_path p = CODEC_HALF_F16C; p <= CODEC_HALF_AVX512_BF16; p++) {
            if (!codec_half_path_supported(p))
                continue;
            codec_f32_to_half(dt, x, out, n, p);
            CHECK(memcmp(out, portable, 2 * n) == 0, "%s path differs from portable (%s)",
                  PATH_NAME[p], bf ? "bf16" : "f16");
            /* a short tail */
            codec_f32_to_half(dt, x + 3, out, 37, p);
            CHECK(memcmp(out, portable + 6, 74) == 0, "%s path tail", PATH_NAME[p]);
        }
    }
    /* every float32 subnormal, where vcvtne2ps2bf16 reads zero */
    for (uint32_t u = 0; u < 0x800000; u += 0x800000 / 65536 - 1) {
        float f;
        memcpy(&f, &u, 4);
        uint8_t a[64], b[64];
        float xs[32];
        for (int i = 0; i < 32; i++)
            xs[i] = i == 5 ? f : 1.0f + (float)i;
        codec_f32_to_half(CODEC_BF16, xs, a, 32, CODEC_HALF_PORTABLE);
        for (codec_half_path p = CODEC_HALF_F16C; p <= CODEC_HALF_AVX512_BF16; p++)
            if (codec_half_path_supported(p)) {
                codec_f32_to_half(CODEC_BF16, xs, b, 32, p);
                CHECK(memcmp(a, b, 64) == 0, "%s: subnormal %08x", PATH_NAME[p], u);
            }
        CHECK((uint16_t)(a[10] | a[11] << 8) == ref_to_half(f, true), "subnormal %08x", u);
    }
    ck_assert_uint_eq(codec_f32_to_f16_one(65504.0f), 0x7bff);
    ck_assert_uint_eq(codec_f32_to_f16_one(65519.99f), 0x7bff);
    ck_assert_uint_eq(codec_f32_to_f16_one(65520.0f), 0x7c00);
    ck_assert_uint_eq(codec_f32_to_f16_one(0x1p-25f), 0x0000);
    ck_assert_uint_eq(codec_f32_to_f16_one(0x1.000002p-25f), 0x0001);
    ck_assert_uint_eq(codec_f32_to_bf16_one(FLT_MAX), 0x7f80);
    free(x);
    free(out);
    free(portable);
}
END_TEST

/* base64 text of little-endian 2-byte elements */
static void half_base64(const uint16_t *h, size_t n, char *out)
{
    uint8_t bytes[64];
    for (size_t i = 0; i < n; i++)
        bytes[2 * i] = (uint8_t)h[i], bytes[2 * i + 1] = (uint8_t)(h[i] >> 8);
    *codec_base64_encode(bytes, 2 * n, out) = '\0';
}

START_TEST(decode_half_base64_tensors)
{
    /* 1, -2, 65504, the smallest subnormal, 0.1 (rounded), -0 */
    const uint16_t f16[] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x2e66, 0x8000};
    const uint16_t bf16[] = {0x3f80, 0xc000, 0x7f7f, 0x0001, 0x3dcd, 0x8000};
    char b64[64], text[256];
    codec_tensor t;
    codec_error e;
    for (int bf = 0; bf <= 1; bf++) {
        const uint16_t *h = bf ? bf16 : f16;
        half_base64(h, 6, b64);
        snprintf(text, sizeof text, "{\"shape\":[2,3],\"dtype\":\"%s\",\"base64\":\"%s\"}",
                 bf ? "bfloat16" : "float16", b64);
        ck_assert_msg(decode(text, false, &t, &e), "%s: %s", text, e.message);
        ck_assert(t.dtype == CODEC_F32 && t.rank == 2 && t.count == 6);
        for (int i = 0; i < 6; i++)
            ck_assert_msg(same_bits(t.f32[i], ref_from_half(h[i], bf)), "%s [%d]", text, i);
        codec_tensor_free(&t);
        /* in a mask too (a numeric bias) */
        ck_assert(decode(text, true, &t, &e));
        codec_tensor_free(&t);
        /* 6 elements of 2 bytes: shape [4] needs 8 */
        snprintf(text, sizeof text, "{\"shape\":[4],\"dtype\":\"%s\",\"base64\":\"%s\"}",
                 bf ? "bfloat16" : "float16", b64);
        expect_error(text, false, 422, "shape_mismatch", "q.base64");
        /* infinities and NaNs are refused as float32 ones are */
        const uint16_t bad[][2] = {{0x7c00, 0x7e00}, {0x7f80, 0x7fc1}};
        for (int k = 0; k < 2; k++) {
            uint16_t v[2] = {0x3c00, bad[bf][k]};
            half_base64(v, 2, b64);
            snprintf(text, sizeof text, "{\"shape\":[3],\"dtype\":\"%s\",\"base64\":\"%s\"}",
                     bf ? "bfloat16" : "float16", b64);
            expect_error(text, false, 400, "invalid_number", "q.base64");
        }
        /* the dtype is for base64: JSON numbers are float32 */
        snprintf(text, sizeof text, "{\"shape\":[1],\"dtype\":\"%s\",\"data\":[1]}",
                 bf ? "bfloat16" : "float16");
        expect_error(text, false, 400, "wrong_type", "q.dtype");
    }
    expect_error("{\"shape\":[1],\"dtype\":\"float64\",\"base64\":\"AAAAAAAA8D8=\"}", false, 400,
                 "wrong_type", "q.dtype");
}
END_TEST

START_TEST(raw_bytes_read_as_base64_bytes_are)
{
    /* float32 1, -2.5, the smallest subnormal; float16 and bfloat16 as in
     * decode_half_base64_tensors; bools */
    const float f32[] = {1.0f, -2.5f, 1e-45f};
    const uint16_t f16[] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x2e66, 0x8000};
    const uint16_t bf16[] = {0x3f80, 0xc000, 0x7f7f, 0x0001, 0x3dcd, 0x8000};
    uint8_t bytes[16];
    codec_tensor t;
    codec_error e;
    int64_t shape3[] = {3}, shape23[] = {2, 3};
    for (int i = 0; i < 3; i++) { /* little-endian, whatever the machine */
        uint32_t u;
        memcpy(&u, &f32[i], 4);
        for (int b = 0; b < 4; b++)
            bytes[4 * i + b] = (uint8_t)(u >> (8 * b));
    }
    ck_assert_msg(codec_tensor_from_raw(bytes, CODEC_F32, 1, shape3, "q", &t, &e), "%s",
                  e.message);
    ck_assert(t.dtype == CODEC_F32 && t.rank == 1 && t.count == 3);
    for (int i = 0; i < 3; i++)
        ck_assert(same_bits(t.f32[i], f32[i]));
    codec_tensor_free(&t);
    /* written back, the same bytes */
    uint8_t back[16];
    codec_tensor_to_bytes(CODEC_F32, f32, back, 3);
    ck_assert(memcmp(back, bytes, 12) == 0);
    for (int bf = 0; bf <= 1; bf++) {
        const uint16_t *h = bf ? bf16 : f16;
        for (int i = 0; i < 6; i++) {
            bytes[2 * i] = (uint8_t)h[i];
            bytes[2 * i + 1] = (uint8_t)(h[i] >> 8);
        }
        codec_dtype d = bf ? CODEC_BF16 : CODEC_F16;
        ck_assert(codec_tensor_from_raw(bytes, d, 2, shape23, "k", &t, &e));
        ck_assert(t.dtype == CODEC_F32 && t.rank == 2 && t.count == 6 && t.shape[1] == 3);
        for (int i = 0; i < 6; i++)
            ck_assert_msg(same_bits(t.f32[i], ref_from_half(h[i], bf)), "%d [%d]", bf, i);
        codec_tensor_to_bytes(d, t.f32, back, 6); /* exact values: the same bits back */
        ck_assert(memcmp(back, bytes, 12) == 0);
        float x = 0.1f;
        codec_tensor_round(d, &x, 1); /* 0.1 as the dtype holds it */
        ck_assert(same_bits(x, ref_from_half(bf ? 0x3dcd : 0x2e66, bf)));
        codec_tensor_free(&t);
        ck_assert_uint_eq(codec_dtype_size(d), 2);
        /* an infinity and a NaN: refused, as in base64 */
        const uint16_t bad[2] = {bf ? 0x7f80 : 0x7c00, bf ? 0x7fc1 : 0x7e00};
        for (int k = 0; k < 2; k++) {
            bytes[2] = (uint8_t)bad[k];
            bytes[3] = (uint8_t)(bad[k] >> 8);
            ck_assert(!codec_tensor_from_raw(bytes, d, 1, shape3, "k", &t, &e));
            ck_assert(e.kind == CODEC_ERR_NOT_FINITE && !strcmp(e.field, "k"));
            ck_assert_ptr_null(t.f32);
        }
    }
    const uint8_t mask[] = {1, 0, 1, 2};
    int64_t shape2[] = {2};
    ck_assert(codec_tensor_from_raw(mask, CODEC_BOOL, 1, shape2, "mask", &t, &e));
    ck_assert(t.dtype == CODEC_BOOL && t.b8[0] == 1 && t.b8[1] == 0);
    codec_tensor_free(&t);
    int64_t shape4[] = {4};
    ck_assert(!codec_tensor_from_raw(mask, CODEC_BOOL, 1, shape4, "mask", &t, &e));
    ck_assert_msg(e.kind == CODEC_ERR_ELEMENT && strstr(e.message, "byte 3 is 2"), "%s",
                  e.message);
}
END_TEST

/* codec_tensor_view_raw: float32 and bool bytes become the tensor where
 * they lie (and stay the caller's), anything else is copied; either way a
 * non-finite element anywhere (the first of a block, its last, the tail
 * after the last whole block) is refused and named. */
START_TEST(raw_bytes_viewed_in_place_and_checked_everywhere)
{
    enum { N = 1000 }; /* 15 blocks of 64 and a tail of 40 */
    static float x[N];
    static uint16_t h[N];
    for (int i = 0; i < N; i++) {
        x[i] = (float)(i % 37) - 18.5f;
        h[i] = 0x3c00; /* 1 in float16, 1.0078125 in bfloat16: finite in both */
    }
    int64_t shape[] = {N / 8, 8};
    codec_tensor t;
    codec_error e;
    ck_assert(codec_tensor_view_raw((const uint8_t *)x, CODEC_F32, 2, shape, "q", &t, &e));
    ck_assert(t.borrowed && t.f32 == x && t.count == N && t.rank == 2 && t.shape[0] == N / 8);
    codec_tensor_free(&t); /* x is static: freeing it would abort */
    ck_assert(!t.borrowed && t.f32 == NULL);
    /* not aligned for a float: a copy of its own, the same numbers */
    _Alignas(16) static uint8_t shifted[4 * 16 + 1];
    memcpy(shifted + 1, x, 4 * 16);
    int64_t shape16[] = {16};
    ck_assert(codec_tensor_view_raw(shifted + 1, CODEC_F32, 1, shape16, "q", &t, &e));
    ck_assert(!t.borrowed && (const void *)t.f32 != (const void *)(shifted + 1));
    for (int i = 0; i < 16; i++)
        ck_assert(same_bits(t.f32[i], x[i]));
    codec_tensor_free(&t);
    /* bools, in place */
    static uint8_t b[N];
    for (int i = 0; i < N; i++)
        b[i] = (uint8_t)(i % 3 == 0);
    ck_assert(codec_tensor_view_raw(b, CODEC_BOOL, 2, shape, "mask", &t, &e));
    ck_assert(t.borrowed && t.b8 == b && t.dtype == CODEC_BOOL);
    codec_tensor_free(&t);
    b[999] = 2;
    ck_assert(!codec_tensor_view_raw(b, CODEC_BOOL, 2, shape, "mask", &t, &e));
    ck_assert_msg(strstr(e.message, "byte 999 is 2"), "%s", e.message);

    const int at[] = {0, 63, 64, 127, 500, 959, 960, 999};
    const float special[] = {INFINITY, -INFINITY, NAN};
    for (size_t a = 0; a < sizeof at / sizeof *at; a++) {
        char want[40];
        snprintf(want, sizeof want, "element %d is", at[a]);
        for (int s = 0; s < 3; s++) {
            float keep = x[at[a]];
            x[at[a]] = special[s];
            ck_assert(!codec_tensor_view_raw((const uint8_t *)x, CODEC_F32, 2, shape, "q", &t,
                                             &e));
            ck_assert_msg(e.kind == CODEC_ERR_NOT_FINITE && strstr(e.message, want), "%s",
                          e.message);
            ck_assert_ptr_null(t.f32);
            ck_assert(!codec_tensor_from_raw((const uint8_t *)x, CODEC_F32, 2, shape, "q", &t,
                                             &e));
            ck_assert_msg(strstr(e.message, want), "%s", e.message);
            x[at[a]] = keep;
        }
        for (int bf = 0; bf <= 1; bf++) {
            const uint16_t bad[2] = {bf ? 0x7f80 : 0x7c00, bf ? 0xffc1 : 0xfe00};
            for (int k = 0; k < 2; k++) {
                h[at[a]] = bad[k];
                ck_assert(!codec_tensor_view_raw((const uint8_t *)h,
                                                 bf ? CODEC_BF16 : CODEC_F16, 2, shape, "k",
                                                 &t, &e));
                ck_assert_msg(e.kind == CODEC_ERR_NOT_FINITE && strstr(e.message, want),
                              "%s", e.message);
                h[at[a]] = 0x3c00;
            }
        }
    }
    /* and, with every special element gone, read again */
    for (int bf = 0; bf <= 1; bf++) {
        ck_assert(codec_tensor_view_raw((const uint8_t *)h, bf ? CODEC_BF16 : CODEC_F16, 2,
                                        shape, "k", &t, &e));
        ck_assert(!t.borrowed && t.dtype == CODEC_F32);
        ck_assert(same_bits(t.f32[N - 1], ref_from_half(0x3c00, bf)));
        codec_tensor_free(&t);
    }
}
END_TEST

START_TEST(encode_half_base64_rounds_to_nearest_even)
{
    const float x[] = {1.0f, -2.0f, 0.1f, 65504.0f, 1e-8f, -0.0f, 3.14159265f, 1.0009765625f};
    int64_t shape[] = {2, 4};
    for (int bf = 0; bf <= 1; bf++) {
        char *text = encode_text(x, 2, shape, bf ? CODEC_ENC_BASE64_BF16 : CODEC_ENC_BASE64_F16);
        uint16_t want[8];
        for (int i = 0; i < 8; i++)
            want[i] = ref_to_half(x[i], bf);
        char b64[64], expect[200];
        half_base64(want, 8, b64);
        snprintf(expect, sizeof expect, "{\"shape\":[2,4],\"dtype\":\"%s\",\"base64\":\"%s\"}",
                 bf ? "bfloat16" : "float16", b64);
        ck_assert_str_eq(text, expect);
        /* and it reads back as the rounded values */
        codec_tensor t;
        codec_error e;
        ck_assert(decode(text, false, &t, &e));
        for (int i = 0; i < 8; i++)
            ck_assert(same_bits(t.f32[i], ref_from_half(want[i], bf)));
        codec_tensor_free(&t);
        free(text);
    }
    size_t at;
    const float big[] = {1, 65519, -65520};
    ck_assert(!codec_half_fits(CODEC_F16, big, 3, &at) && at == 2);
    ck_assert(codec_half_fits(CODEC_F16, big, 2, &at));
    ck_assert(codec_half_fits(CODEC_BF16, big, 3, &at));
    const float huge[] = {3.3895e38f, -FLT_MAX};
    ck_assert(!codec_half_fits(CODEC_BF16, huge, 2, &at) && at == 1);
}
END_TEST

/* ======================================================== buf, base64 */

START_TEST(buf_grows_and_formats)
{
    codec_buf b = {0};
    for (int i = 0; i < 10000; i++)
        codec_buf_printf(&b, "%d,", i % 10);
    ck_assert_int_eq(b.len, 20000);
    ck_assert(b.data[b.len] == 0);
    char big[1000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    codec_buf_printf(&b, "[%s]", big);
    ck_assert_int_eq(b.len, 20000 + 1001);
    codec_buf_puts(&b, "end");
    ck_assert(strcmp(b.data + b.len - 4, "]end") == 0);
    codec_buf_free(&b);
    ck_assert(b.data == NULL && b.len == 0);
}
END_TEST

START_TEST(base64_rfc4648_vectors)
{
    const char *in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *out[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        char enc[16];
        size_t n = strlen(in[i]);
        char *e = codec_base64_encode((const uint8_t *)in[i], n, enc);
        ck_assert_int_eq(e - enc, (long)codec_base64_encoded_len(n));
        ck_assert(strncmp(enc, out[i], strlen(out[i])) == 0 && e - enc == (long)strlen(out[i]));
        size_t dn, bad;
        ck_assert(codec_base64_decoded_len(out[i], strlen(out[i]), &dn));
        ck_assert_int_eq(dn, n);
        uint8_t dec[16];
        ck_assert(codec_base64_decode(out[i], strlen(out[i]), dec, &bad));
        ck_assert(memcmp(dec, in[i], n) == 0);
    }
    size_t dn, bad;
    uint8_t dec[16];
    ck_assert(!codec_base64_decoded_len("Zg=", 3, &dn));
    ck_assert(!codec_base64_decoded_len("Z===", 4, &dn));
    ck_assert(!codec_base64_decode("Zh==", 4, dec, &bad)); /* padding bits set */
    ck_assert(!codec_base64_decode("Z=g=", 4, dec, &bad));
    ck_assert(!codec_base64_decode("Zm9v\nYg==", 9, dec, &bad));
}
END_TEST

/* Base64 written out bit by bit, as RFC 4648 describes it: the bits of the
 * bytes in order, six at a time, the last group filled with zeros, '='
 * to a multiple of four characters. */
static size_t ref_base64(const uint8_t *in, size_t n, char *out)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t bits = 8 * n, len = 0;
    for (size_t b = 0; b < bits; b += 6) {
        int v = 0;
        for (size_t k = b; k < b + 6; k++)
            v = v << 1 | (k < bits ? in[k / 8] >> (7 - k % 8) & 1 : 0);
        out[len++] = abc[v];
    }
    while (len % 4)
        out[len++] = '=';
    return len;
}

/* Both paths (AVX2 where the CPU runs it), at every length around their
 * block sizes, encode as the reference does and decode its text back; a
 * text with any byte at all in any place is refused at that place, by
 * both alike. */
START_TEST(base64_paths_match_a_bit_by_bit_reference)
{
    uint64_t seed = 9;
    enum { MAX = 300 };
    uint8_t in[MAX], back[MAX + 32];
    char want[MAX / 3 * 4 + 8], got[MAX / 3 * 4 + 40];
    int paths = 0;
    for (int avx2 = 0; avx2 <= 1; avx2++) {
        if (avx2 && !codec_simd_supported(CODEC_SIMD_AVX2)) {
            printf("base64 path avx2: not on this CPU, skipped\n");
            continue;
        }
        paths++;
        for (size_t n = 0; n <= MAX; n++) {
            for (size_t i = 0; i < n; i++)
                in[i] = (uint8_t)rng_next(&seed);
            size_t len = ref_base64(in, n, want);
            char *end = codec_base64_encode_with(in, n, got, avx2);
            CHECK((size_t)(end - got) == len && memcmp(got, want, len) == 0,
                  "avx2=%d: encoding %zu bytes differs from the reference", avx2, n);
            size_t dn, bad;
            CHECK(codec_base64_decoded_len(want, len, &dn) && dn == n, "length of %zu bytes", n);
            CHECK(codec_base64_decode_with(want, len, back, &bad, avx2) &&
                      memcmp(back, in, n) == 0,
                  "avx2=%d: %zu bytes do not decode back", avx2, n);
            if (len < 8)
                continue;
            /* one byte replaced, anywhere before the padding */
            size_t pad = want[len - 1] == '=' ? (want[len - 2] == '=' ? 2 : 1) : 0;
            for (int t = 0; t < 4; t++) {
                char text[sizeof want];
                memcpy(text, want, len);
                size_t at = rng_next(&seed) % (len - pad);
                unsigned char c = (unsigned char)rng_next(&seed);
                text[at] = (char)c;
                bool known = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                             (c >= '0' && c <= '9') || c == '+' || c == '/';
                bool ok = codec_base64_decode_with(text, len, back, &bad, avx2);
                /* a known character in the last quad may set padding bits */
                if (known && at < len - 4)
                    CHECK(ok, "avx2=%d: byte %u at %zu refused", avx2, c, at);
                if (!known)
                    CHECK(!ok && bad == at, "avx2=%d: byte %u at %zu: %s at %zu", avx2, c, at,
                          ok ? "accepted" : "refused", bad);
            }
        }
    }
    /* every byte value in every place of a block of 32 characters */
    for (int avx2 = 0; avx2 <= 1 && (!avx2 || codec_simd_supported(CODEC_SIMD_AVX2)); avx2++)
        for (int c = 0; c < 256; c++)
            for (size_t at = 0; at < 48; at++) {
                char text[64];
                memset(text, 'Q', sizeof text);
                text[at] = (char)c;
                size_t bad;
                bool known = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                             (c >= '0' && c <= '9') || c == '+' || c == '/';
                bool ok = codec_base64_decode_with(text, sizeof text, back, &bad, avx2);
                CHECK(ok == known && (known || bad == at), "avx2=%d: byte %d at %zu", avx2, c,
                      at);
            }
    ck_assert_int_ge(paths, 1);
}
END_TEST

/* ============================================================ robustness */

START_TEST(mutated_documents_never_crash)
{
    const char *seeds[] = {
        "[[1, 2.5, -3e-2], [4, 5, 6]]",
        "{\"shape\": [2, 2], \"data\": [1, 2, 3, 4]}",
        "{\"shape\": [1, 2], \"dtype\": \"float32\", \"base64\": \"AACAPwAAAMA=\"}",
        "{\"shape\": [2], \"dtype\": \"bool\", \"base64\": \"AQA=\"}",
        "[[true, false], [false, true]]",
        "{\"q\": [[1]], \"k\\u0041\": {\"a\": [\"\\ud83d\\ude00\"]}, \"s\": 1e5}",
    };
    const char alphabet[] = "[]{},:\"\\-+.eE0123456789tfnu \n\x80\xc3\xff/=A";
    uint64_t seed = 99;
    fenced f = fence_make(256);
    for (int iter = 0; iter < 6000; iter++) {
        const char *src = seeds[iter % 6];
        size_t len = strlen(src);
        char buf[256];
        memcpy(buf, src, len);
        int edits = 1 + (int)(rng_next(&seed) % 4);
        for (int k = 0; k < edits; k++) {
            uint64_t r = rng_next(&seed);
            size_t at = (size_t)(r >> 8) % (len + 1);
            char c = alphabet[(r >> 40) % (sizeof alphabet - 1)];
            switch (r % 3) {
            case 0: /* replace */
                if (at < len)
                    buf[at] = c;
                break;
            case 1: /* insert */
                if (len < sizeof buf - 1) {
                    memmove(buf + at + 1, buf + at, len - at);
                    buf[at] = c;
                    len++;
                }
                break;
            default: /* delete, or cut short */
                if (r & 0x100)
                    len = at;
                else if (at < len) {
                    memmove(buf + at, buf + at + 1, len - at - 1);
                    len--;
                }
            }
        }
        const char *text = fence_put(&f, buf, len);
        codec_error e;
        codec_tensor t;
        bool ok = codec_validate(text, len, &e);
        if (ok && (iter % 6) == 5) {
            codec_member m[4];
            size_t n;
            (void)codec_members(text, text + len, m, 4, &n, "", &e);
        }
        /* decode is meant for validated text, but must not crash on any */
        if (codec_tensor_decode(text, text + len, "q", true, &t, &e))
            codec_tensor_free(&t);
    }
    unfence(&f);
}
END_TEST

/* ================================================================ rows */

/* The classes of row_scan.c, byte by byte, as the reference for its masks:
 * first where the block ends, then the class of each byte before that. */
static void ref_classify(const char *p, codec_row_block *b)
{
    *b = (codec_row_block){0};
    unsigned i = 0;
    for (; i < 64 && p[i] != 0 && strchr("0123456789.-, \n\r\t", p[i]); i++)
        if (p[i] == ',')
            b->len = i + 1;
    b->stop = i;
    for (unsigned k = 0; k < b->len; k++) {
        char c = p[k];
        uint64_t bit = UINT64_C(1) << k;
        b->digit |= c >= '0' && c <= '9' ? bit : 0;
        b->zero |= c == '0' ? bit : 0;
        b->point |= c == '.' ? bit : 0;
        b->minus |= c == '-' ? bit : 0;
        b->comma |= c == ',' ? bit : 0;
        b->space |= c == ' ' || c == '\n' || c == '\r' || c == '\t' ? bit : 0;
    }
}

static bool ref_space(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

/* RFC 8259's number at s[*i..n): -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?,
 * the exponent part only when `exponent`. */
static bool ref_number_at(const char *s, size_t n, size_t *i, bool exponent)
{
    size_t k = *i;
    if (k < n && s[k] == '-')
        k++;
    if (k >= n || s[k] < '0' || s[k] > '9')
        return false;
    if (s[k] == '0')
        k++;
    else
        while (k < n && s[k] >= '0' && s[k] <= '9')
            k++;
    if (k < n && s[k] == '.') {
        k++;
        if (k >= n || s[k] < '0' || s[k] > '9')
            return false;
        while (k < n && s[k] >= '0' && s[k] <= '9')
            k++;
    }
    if (exponent && k < n && (s[k] == 'e' || s[k] == 'E')) {
        k++;
        if (k < n && (s[k] == '+' || s[k] == '-'))
            k++;
        if (k >= n || s[k] < '0' || s[k] > '9')
            return false;
        while (k < n && s[k] >= '0' && s[k] <= '9')
            k++;
    }
    *i = k;
    return true;
}

/* What codec_row_grammar promises of s[0..n): (ws* number ws* ',')+. */
static bool ref_block_grammar(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        while (i < n && ref_space(s[i]))
            i++;
        if (!ref_number_at(s, n, &i, false))
            return false;
        while (i < n && ref_space(s[i]))
            i++;
        if (i >= n || s[i] != ',')
            return false;
        i++;
    }
    return n > 0;
}

/* ws* '[' ws* (number ws* (',' ws* number ws*)*)? ']' ws*: a JSON array of numbers. */
static bool ref_number_array(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && ref_space(s[i]))
        i++;
    if (i >= n || s[i++] != '[')
        return false;
    while (i < n && ref_space(s[i]))
        i++;
    if (i < n && s[i] != ']')
        for (;;) {
            if (!ref_number_at(s, n, &i, true))
                return false;
            while (i < n && ref_space(s[i]))
                i++;
            if (i < n && s[i] == ',') {
                i++;
                while (i < n && ref_space(s[i]))
                    i++;
                continue;
            }
            break;
        }
    if (i >= n || s[i++] != ']')
        return false;
    while (i < n && ref_space(s[i]))
        i++;
    return i == n;
}

/* Appends one number of a random kind: what clients send (9 digits,
 * Python's 17, integers, exponents), and the awkward ones (-0, leading
 * zeros after the point, more than 19 digits, past float32's range). */
static size_t random_number(char *w, uint64_t *seed)
{
    uint64_t r = rng_next(seed);
    double x = ((double)(r >> 11) * 0x1p-53 - 0.5) * 8;
    switch (r % 12) {
    case 0: return (size_t)sprintf(w, "%.9g", x);
    case 1: return (size_t)sprintf(w, "%.17g", (double)(float)x);
    case 2: return (size_t)sprintf(w, "%d", (int)(r >> 40) % 2000 - 1000);
    case 3: return (size_t)sprintf(w, "%.3e", x * 1e-12);
    case 4: return (size_t)sprintf(w, "%s0", r & 64 ? "-" : "");
    case 5: return (size_t)sprintf(w, "%.12f", x * 1e-6);
    case 6: return (size_t)sprintf(w, "%.25f", x);
    case 7: return (size_t)sprintf(w, "%.0f", x * 1e30);
    case 8: return (size_t)sprintf(w, "%.0f", x * 1e40); /* not finite as a float32 */
    case 9: return (size_t)sprintf(w, "%.1f", x * 1e8);
    default: return (size_t)sprintf(w, "%.8g", x);
    }
}

static const char *const SEPARATORS[] = {", ", ",", " , ", ",\n  ", "\t,\r\n", ",  "};

/* A row of `count` random numbers with random separators, then `edits`
 * random edits from the row alphabet and a few bytes outside it. */
static size_t random_row(char *buf, size_t cap, int count, int edits, uint64_t *seed)
{
    size_t w = 0;
    for (int i = 0; i < count && w + 64 < cap; i++) {
        if (i)
            w += (size_t)sprintf(buf + w, "%s", SEPARATORS[rng_next(seed) % 6]);
        w += random_number(buf + w, seed);
    }
    static const char alphabet[] = "0123456789.-, \n00..--,,eE+]x";
    for (int k = 0; k < edits && w > 0 && w + 1 < cap; k++) {
        uint64_t r = rng_next(seed);
        size_t at = (size_t)(r >> 8) % w;
        char c = alphabet[(r >> 40) % (sizeof alphabet - 1)];
        if (r % 3 == 0)
            buf[at] = c;
        else if (r % 3 == 1) {
            memmove(buf + at + 1, buf + at, w - at);
            buf[at] = c;
            w++;
        } else {
            memmove(buf + at, buf + at + 1, w - at - 1);
            w--;
        }
    }
    buf[w] = 0;
    return w;
}

START_TEST(row_scan_paths_classify_every_byte_and_sign_alike)
{
    uint64_t seed = 5;
    char text[64 + 1];
    int paths = 0;
    for (int path = CODEC_SIMD_PORTABLE; path <= CODEC_SIMD_AVX512; path++) {
        if (!codec_simd_supported((codec_simd)path)) {
            printf("row scan path %s: not on this CPU, skipped\n",
                   codec_simd_name((codec_simd)path));
            continue;
        }
        paths++;
        for (int iter = 0; iter < 20000; iter++) {
            char row[512];
            size_t n = random_row(row, sizeof row, 8, (int)(iter % 3), &seed);
            if (n < 64)
                continue;
            memcpy(text, row + rng_next(&seed) % (n - 63), 64);
            /* now and then any byte at all */
            if (iter % 7 == 0)
                text[rng_next(&seed) % 64] = (char)rng_next(&seed);
            codec_row_block want, got;
            ref_classify(text, &want);
            codec_row_scan_with(text, &got, (codec_simd)path);
            CHECK(want.digit == got.digit && want.zero == got.zero && want.point == got.point &&
                      want.minus == got.minus && want.comma == got.comma &&
                      want.space == got.space && want.len == got.len && want.stop == got.stop,
                  "path %s: %.64s: len %u stop %u, want %u and %u",
                  codec_simd_name((codec_simd)path), text, got.len, got.stop, want.len, want.stop);
            /* the points and minus signs a noted block's reader finds are the
             * classifier's (which cuts them to the block) */
            uint64_t keep = want.len == 64 ? ~UINT64_C(0) : (UINT64_C(1) << want.len) - 1;
            uint64_t point, minus;
            codec_row_signs_with(text, &point, &minus, (codec_simd)path);
            CHECK((point & keep) == want.point && (minus & keep) == want.minus,
                  "path %s: %.64s: signs", codec_simd_name((codec_simd)path), text);
        }
    }
    ck_assert_int_ge(paths, 1);
    printf("row scan: %d path(s) checked, %s in use\n", paths,
           codec_simd_name(codec_simd_in_use()));
}
END_TEST

START_TEST(row_block_grammar_matches_a_reference_recognizer)
{
    uint64_t seed = 6;
    int accepted = 0, refused = 0;
    for (int iter = 0; iter < 300000; iter++) {
        char row[600];
        size_t n = random_row(row, sizeof row, 12, (int)(iter % 4), &seed);
        if (n < 64)
            continue;
        /* from a number's start (the validator's and reader's entry), or
         * any byte */
        size_t at = 0;
        if (iter & 1) {
            at = rng_next(&seed) % (n - 63);
        }
        codec_row_block b;
        codec_row_scan(row + at, &b);
        if (!b.len)
            continue;
        bool want = ref_block_grammar(row + at, b.len);
        CHECK(codec_row_grammar(&b) == want, "%.*s: grammar %d, reference %d", (int)b.len,
              row + at, !want, want);
        want ? accepted++ : refused++;
    }
    /* both answers were asked for often */
    ck_assert_int_gt(accepted, 20000);
    ck_assert_int_gt(refused, 20000);
}
END_TEST

START_TEST(validator_accepts_long_rows_exactly_when_a_reference_does)
{
    uint64_t seed = 7;
    int valid_rows = 0, invalid_rows = 0;
    fenced f = fence_make(2400);
    for (int iter = 0; iter < 20000; iter++) {
        char doc[2400];
        size_t w = 0;
        doc[w++] = '[';
        if (iter % 5 == 0)
            doc[w++] = ' ';
        w += random_row(doc + w, sizeof doc - w - 8, 10 + (int)(iter % 60), (int)(iter % 3),
                        &seed);
        memcpy(doc + w, iter % 4 ? "]" : " ]\n", iter % 4 ? 1 : 3);
        w += iter % 4 ? 1 : 3;
        /* the end of the text right after the document: reads past it fault */
        const char *text = fence_put(&f, doc, w);
        codec_error e;
        bool want = ref_number_array(doc, w);
        bool got = codec_validate(text, w, &e);
        CHECK(got == want, "%.*s: validator %d, reference %d (%s)", (int)w, doc, got, want,
              got ? "" : e.message);
        if (want) {
            /* and the reader gives strtod's floats, or names the first
             * number that is not finite */
            static float ref[2400];
            int64_t count = 0, not_finite = -1;
            for (const char *p = doc + 1;;) {
                while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\r' || *p == '\t')
                    p++;
                if (*p == ']')
                    break;
                char *q;
                ref[count] = (float)strtod(p, &q);
                if (!isfinite(ref[count]) && not_finite < 0)
                    not_finite = count;
                count++;
                p = q;
            }
            codec_tensor t;
            bool ok = codec_tensor_decode(text, text + w, "q", false, &t, &e);
            if (not_finite >= 0) {
                char name[32];
                snprintf(name, sizeof name, "q[%lld] is", (long long)not_finite);
                CHECK(!ok && strstr(e.message, name), "%.*s: %s, want %s", (int)w, doc,
                      ok ? "decoded" : e.message, name);
            } else {
                CHECK(ok && t.count == count, "%.*s: %lld elements, want %lld", (int)w, doc,
                      ok ? (long long)t.count : -1LL, (long long)count);
                for (int64_t i = 0; i < count; i++)
                    CHECK(same_bits(t.f32[i], ref[i]), "%.*s: element %lld", (int)w, doc,
                          (long long)i);
            }
            if (ok)
                codec_tensor_free(&t);
        }
        want ? valid_rows++ : invalid_rows++;
    }
    unfence(&f);
    ck_assert_int_gt(valid_rows, 3000);
    ck_assert_int_gt(invalid_rows, 3000);
}
END_TEST

/* ============================================================ the library */

/* A tensor through codec_doc_tensor (the validator's notes) and through
 * codec_tensor_decode (none): the same floats, or the same error. */
static void expect_doc_reads_alike(const char *body, size_t len, const char *value,
                                   const char *value_end)
{
    codec_doc doc;
    codec_span spans[4];
    codec_error e1, e2;
    ck_assert_msg(codec_doc_validate(&doc, body, len, spans, 4, &e1), "%s", e1.message);
    codec_tensor a, b;
    bool ok1 = codec_doc_tensor(&doc, value, value_end, "q", false, &a, &e1);
    bool ok2 = codec_tensor_decode(value, value_end, "q", false, &b, &e2);
    codec_doc_free(&doc);
    CHECK(ok1 == ok2, "%.200s: with notes %d (%s), without %d (%s)", value, ok1,
          ok1 ? "" : e1.message, ok2, ok2 ? "" : e2.message);
    if (ok1) {
        CHECK(a.rank == b.rank && a.count == b.count &&
                  memcmp(a.shape, b.shape, sizeof a.shape[0] * (size_t)a.rank) == 0,
              "%.200s: shapes differ", value);
        for (int64_t i = 0; i < a.count; i++)
            CHECK(same_bits(a.f32[i], b.f32[i]), "%.200s: element %lld differs", value,
                  (long long)i);
        codec_tensor_free(&a);
        codec_tensor_free(&b);
    } else {
        /* the same error, its place counted from the document's start with
         * the notes and from the value's without */
        CHECK(e1.kind == e2.kind && !strcmp(e1.message, e2.message) &&
                  !strcmp(e1.field, e2.field) &&
                  e1.offset == e2.offset + (e2.line ? (size_t)(value - body) : 0),
              "%.200s: %s (at %zu) / %s (at %zu)", value, e1.message, e1.offset, e2.message,
              e2.offset);
    }
}

START_TEST(doc_tensor_reads_rows_from_the_notes_as_from_the_text)
{
    uint64_t seed = 11;
    size_t cap = 1 << 16;
    char *body = malloc(cap);
    ck_assert(body != NULL);
    size_t noted = 0;
    for (int iter = 0; iter < 3000; iter++) {
        /* {"q": [[row], [row], ...]} or {"q": {"shape": [n], "data": [row]}},
         * rows of short integers (which outrun the reader's first guess at
         * the element count), of client floats, of anything */
        int rows = 1 + (int)(rng_next(&seed) % 6), width = 1 + (int)(rng_next(&seed) % 200);
        bool flat = iter % 4 == 3;
        size_t w = (size_t)sprintf(body, "{\"k\": 1, \"q\": ");
        const char *value = body + w;
        if (flat)
            w += (size_t)sprintf(body + w, "{\"shape\": [%d], \"data\": ", width);
        w += (size_t)sprintf(body + w, "[");
        for (int r = 0; r < (flat ? 1 : rows); r++) {
            w += (size_t)sprintf(body + w, "%s%s", r ? ", " : "", flat ? "" : "[");
            for (int i = 0; i < width && w + 200 < cap; i++) {
                if (i)
                    w += (size_t)sprintf(body + w, "%s", SEPARATORS[rng_next(&seed) % 6]);
                uint64_t kind = rng_next(&seed) % 8;
                if (iter % 3 == 0 && kind < 6)
                    w += (size_t)sprintf(body + w, "%d", (int)(rng_next(&seed) % 10));
                else
                    w += random_number(body + w, &seed);
            }
            w += (size_t)sprintf(body + w, "%s", flat ? "" : "]");
        }
        w += (size_t)sprintf(body + w, "]%s", flat ? "}" : "");
        const char *value_end = body + w;
        w += (size_t)sprintf(body + w, ", \"v\": [1, 2]}");
        codec_doc doc;
        codec_error e;
        ck_assert(codec_doc_validate(&doc, body, w, NULL, 0, &e));
        noted += doc.n_blocks;
        codec_doc_free(&doc);
        expect_doc_reads_alike(body, w, value, value_end);
    }
    /* the notes were there to be used */
    ck_assert_uint_gt(noted, 10000);
    free(body);
}
END_TEST

/* A block ends at the first byte that is no part of a plain number (an
 * exponent's 'e', the row's ']'), and the one-number code goes past that
 * byte before the next block is tried: the rest of the row is still noted
 * in blocks, still checked byte by byte and read as strtod reads it. */
START_TEST(blocks_resume_after_the_byte_that_ended_one)
{
    for (int bad = -1; bad < 25; bad++) {
        /* {"q": [n, n, 1.5e-3, n x 25]}: the first block (64 bytes from the
         * first number) ends at the 'e'; number `bad` of the tail has a
         * leading zero (not JSON) */
        char body[2048];
        size_t w = (size_t)sprintf(body, "{\"q\": [");
        const char *value = body + 6;
        float want[28];
        size_t bad_at = 0;
        for (int i = 0; i < 28; i++) {
            char num[32];
            bool at_fault = i >= 3 && i - 3 == bad;
            if (i == 2)
                snprintf(num, sizeof num, "1.5e-3");
            else
                snprintf(num, sizeof num, "%s%d.%016d", i % 2 ? "-" : "",
                         at_fault ? 0 : i % 10, 1234567 * (i + 1));
            if (at_fault) { /* "-00.…" or "00.…": the second 0 is at fault */
                memmove(num + (i % 2) + 1, num + (i % 2), strlen(num + (i % 2)) + 1);
                bad_at = w + 2 + (size_t)(i % 2) + 1;
            }
            w += (size_t)sprintf(body + w, "%s%s", i ? ", " : "", num);
            want[i] = (float)strtod(num, NULL);
        }
        const char *value_end = body + w + 1;
        w += (size_t)sprintf(body + w, "]}");
        codec_doc doc;
        codec_error e;
        bool ok = codec_doc_validate(&doc, body, w, NULL, 0, &e);
        if (bad >= 0) {
            CHECK(!ok && e.kind == CODEC_ERR_SYNTAX && e.offset == bad_at,
                  "%s: %s at %zu, want a syntax error at %zu", body, ok ? "valid" : e.message,
                  ok ? 0 : e.offset, bad_at);
            codec_doc_free(&doc);
            continue;
        }
        ck_assert_msg(ok, "%s", e.message);
        /* a block before the exponent, and blocks again after it */
        CHECK(doc.n_blocks >= 3, "%s: %zu blocks noted", body, doc.n_blocks);
        codec_tensor t;
        ck_assert(codec_doc_tensor(&doc, value, value_end, "q", false, &t, &e));
        ck_assert_int_eq(t.count, 28);
        for (int i = 0; i < 28; i++)
            CHECK(same_bits(t.f32[i], want[i]), "element %d", i);
        codec_tensor_free(&t);
        codec_doc_free(&doc);
        expect_doc_reads_alike(body, w, value, value_end);
    }
}
END_TEST

/* Rows of a few long numbers, longer than a block (a client's float32s
 * printed as doubles, 4 to a row): the number after the first block is the
 * row's last and is checked alone; a fault in any number is still found at
 * its byte, and the rows read as strtod reads them. */
START_TEST(short_rows_of_long_numbers_checked_in_every_number)
{
    uint64_t seed = 21;
    for (int bad = -1; bad < 16; bad++) {
        char body[2048];
        size_t w = (size_t)sprintf(body, "{\"q\": [");
        const char *value = body + 6;
        float want[16];
        size_t bad_at = 0;
        for (int i = 0; i < 16; i++) {
            if (i % 4 == 0)
                w += (size_t)sprintf(body + w, "%s[", i ? ", " : "");
            else
                w += (size_t)sprintf(body + w, ", ");
            char num[40];
            float x = (float)((double)(rng_next(&seed) >> 11) * 0x1p-53 * 4 - 2);
            int n = snprintf(num, sizeof num, "%.17g", (double)x);
            if (i == bad) { /* a leading zero: the digit after it is at fault */
                int at = num[0] == '-';
                memmove(num + at + 1, num + at, (size_t)(n - at) + 1);
                num[at] = '0';
                bad_at = w + (size_t)at + 1;
            }
            w += (size_t)sprintf(body + w, "%s", num);
            want[i] = (float)strtod(num, NULL);
            if (i % 4 == 3)
                w += (size_t)sprintf(body + w, "]");
        }
        const char *value_end = body + w + 1;
        w += (size_t)sprintf(body + w, "], \"k\": [1, 2]}");
        codec_doc doc;
        codec_error e;
        bool ok = codec_doc_validate(&doc, body, w, NULL, 0, &e);
        if (bad >= 0) {
            CHECK(!ok && e.kind == CODEC_ERR_SYNTAX && e.offset == bad_at,
                  "%s: %s at %zu, want a syntax error at %zu", body, ok ? "valid" : e.message,
                  ok ? 0 : e.offset, bad_at);
            codec_doc_free(&doc);
            continue;
        }
        ck_assert_msg(ok, "%s", e.message);
        codec_tensor t;
        ck_assert(codec_doc_tensor(&doc, value, value_end, "q", false, &t, &e));
        ck_assert_int_eq(t.count, 16);
        for (int i = 0; i < 16; i++)
            CHECK(same_bits(t.f32[i], want[i]), "element %d", i);
        codec_tensor_free(&t);
        codec_doc_free(&doc);
        expect_doc_reads_alike(body, w, value, value_end);
    }
}
END_TEST

START_TEST(codec_error_gives_the_place_of_the_fault)
{
    codec_error e;
    /* the validator: the ']' after the trailing comma */
    const char *s = "{\n  \"a\": [1, 2,]\n}";
    ck_assert(!codec_validate(s, strlen(s), &e));
    ck_assert_int_eq(e.kind, CODEC_ERR_SYNTAX);
    ck_assert_uint_eq(e.offset, 15);
    ck_assert_int_eq(e.line, 2);
    ck_assert_int_eq(e.column, 14);
    /* a tensor's element: counted from the value given, or with a document
     * from the document's start */
    const char *body = "{\"q\":\n [[1, 2],\n  [3, \"x\"]]}";
    const char *value = strchr(body, '[');
    codec_tensor t;
    ck_assert(!codec_tensor_decode(value, body + strlen(body) - 1, "q", false, &t, &e));
    ck_assert_int_eq(e.kind, CODEC_ERR_WRONG_TYPE);
    ck_assert_uint_eq(e.offset, (size_t)(strchr(body, 'x') - 1 - value));
    ck_assert_int_eq(e.line, 2);
    ck_assert_int_eq(e.column, 7);
    codec_doc doc;
    codec_span spans[4];
    ck_assert(codec_doc_validate(&doc, body, strlen(body), spans, 4, &e));
    ck_assert(!codec_doc_tensor(&doc, value, body + strlen(body) - 1, "q", false, &t, &e));
    codec_doc_free(&doc);
    ck_assert_uint_eq(e.offset, (size_t)(strchr(body, 'x') - 1 - body));
    ck_assert_int_eq(e.line, 3);
    ck_assert_int_eq(e.column, 7);
    ck_assert_str_eq(e.field, "q");
    /* a ragged row: the ']' that closes the row of the wrong length */
    const char *ragged = "[[1, 2], [3]]";
    ck_assert(!codec_tensor_decode(ragged, ragged + strlen(ragged), "q", false, &t, &e));
    ck_assert_int_eq(e.kind, CODEC_ERR_RAGGED);
    ck_assert_uint_eq(e.offset, 11);
    /* a length that does not match the shape is at no one byte */
    const char *mismatch = "{\"shape\": [3], \"data\": [1, 2]}";
    ck_assert(!codec_tensor_decode(mismatch, mismatch + strlen(mismatch), "q", false, &t, &e));
    ck_assert_int_eq(e.kind, CODEC_ERR_SHAPE_MISMATCH);
    ck_assert_int_eq(e.line, 0);
    ck_assert_int_eq(e.column, 0);
    /* a duplicate key: the second one */
    const char *dup = "{\"a\": 1, \"a\": 2}";
    codec_member m[4];
    size_t n;
    ck_assert(!codec_members(dup, dup + strlen(dup), m, 4, &n, "", &e));
    ck_assert_int_eq(e.kind, CODEC_ERR_DUPLICATE_KEY);
    ck_assert_uint_eq(e.offset, 9);
}
END_TEST

/* The number at s as an integer within limit. */
static codec_int_result integer(const char *s, int64_t limit, int64_t *out)
{
    const char *stop;
    codec_int_result r = codec_parse_integer(s, s + strlen(s), limit, &stop, out);
    CHECK(stop == s + strlen(s), "%s: stopped at %td", s, stop - s);
    return r;
}

START_TEST(parse_integer_decides_on_the_digits)
{
    static const struct {
        const char *text;
        int64_t limit;
        codec_int_result want;
        int64_t value;
    } cases[] = {
        {"0", 10, CODEC_INT_OK, 0},
        {"-0", 10, CODEC_INT_OK, 0},
        {"-0.0e7", 10, CODEC_INT_OK, 0},
        {"7", 10, CODEC_INT_OK, 7},
        {"-7", 10, CODEC_INT_OK, -7},
        {"2.0", 10, CODEC_INT_OK, 2},
        {"2e0", 10, CODEC_INT_OK, 2},
        {"0.2e1", 10, CODEC_INT_OK, 2},
        {"200e-2", 10, CODEC_INT_OK, 2},
        {"2.5", 10, CODEC_INT_FRACTION, 0},
        {"-2.5", 10, CODEC_INT_FRACTION, 0},
        {"1e-400", 10, CODEC_INT_FRACTION, 0},
        {"2.0000000000000000001", 10, CODEC_INT_FRACTION, 0},
        {"2.00000000000000000000000000000000000000", 10, CODEC_INT_OK, 2},
        {"10", 10, CODEC_INT_OK, 10},
        {"10.5", 10, CODEC_INT_RANGE, 0},
        {"11", 10, CODEC_INT_RANGE, 0},
        {"-11", 10, CODEC_INT_RANGE, 0},
        {"1e15", 1000000000000000, CODEC_INT_OK, 1000000000000000},
        {"1000000000000000", 1000000000000000, CODEC_INT_OK, 1000000000000000},
        {"-1000000000000000.0", 1000000000000000, CODEC_INT_OK, -1000000000000000},
        {"1000000000000000.1", 1000000000000000, CODEC_INT_RANGE, 0},
        {"1000000000000001", 1000000000000000, CODEC_INT_RANGE, 0},
        {"999999999999999.5", 1000000000000000, CODEC_INT_FRACTION, 0},
        {"4611686018427387904", INT64_C(1) << 62, CODEC_INT_OK, INT64_C(1) << 62},
        {"4611686018427387905", INT64_C(1) << 62, CODEC_INT_RANGE, 0},
        {"4.611686018427387904e18", INT64_C(1) << 62, CODEC_INT_OK, INT64_C(1) << 62},
        {"1e19", INT64_C(1) << 62, CODEC_INT_RANGE, 0},
        {"99999999999999999999999", INT64_C(1) << 62, CODEC_INT_RANGE, 0},
        {"1e100000000", INT64_C(1) << 62, CODEC_INT_RANGE, 0},
        {"123456789012345678.5", 1000000000000000000, CODEC_INT_FRACTION, 0},
        {"0.000000000000000000000000000000000000000003e42", 10, CODEC_INT_OK, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t v = -99;
        codec_int_result r = integer(cases[i].text, cases[i].limit, &v);
        ck_assert_msg(r == cases[i].want, "%s: %d, want %d", cases[i].text, r, cases[i].want);
        if (r == CODEC_INT_OK)
            ck_assert_msg(v == cases[i].value, "%s: %lld", cases[i].text, (long long)v);
    }
    /* every way of writing random integers reads back as them, and a half
     * added never does */
    uint64_t seed = 21;
    for (int iter = 0; iter < 200000; iter++) {
        int64_t x = (int64_t)(rng_next(&seed) % 2000000000000001u) - 1000000000000000;
        char text[80];
        int zeros = (int)(rng_next(&seed) % 4);
        switch (iter % 4) {
        case 0: snprintf(text, sizeof text, "%lld", (long long)x); break;
        case 1: snprintf(text, sizeof text, "%lld.%.*s", (long long)x, zeros + 1, "0000"); break;
        case 2: snprintf(text, sizeof text, "%lld%.*se-%d", (long long)x, zeros, "0000", zeros);
            break;
        default: snprintf(text, sizeof text, "%lld.5", (long long)x); break;
        }
        int64_t v;
        codec_int_result r = integer(text, 1000000000000000, &v);
        if (iter % 4 == 3)
            CHECK(r == CODEC_INT_FRACTION || (r == CODEC_INT_RANGE && llabs(x) == 1000000000000000),
                  "%s: %d", text, r);
        else
            CHECK(r == CODEC_INT_OK && v == x, "%s: %d %lld", text, r, (long long)v);
    }
}
END_TEST

START_TEST(simd_switch_caps_the_width_in_use)
{
    codec_simd was = codec_simd_in_use();
    for (int s = CODEC_SIMD_PORTABLE; s <= CODEC_SIMD_AVX512; s++) {
        codec_set_simd((codec_simd)s);
        codec_simd now = codec_simd_in_use();
        ck_assert_int_le(now, s);
        ck_assert(codec_simd_supported(now));
        /* the widest the CPU runs up to the cap */
        for (int wider = now + 1; wider <= s; wider++)
            ck_assert(!codec_simd_supported((codec_simd)wider));
    }
    codec_set_simd(CODEC_SIMD_PORTABLE);
    ck_assert_int_eq(codec_half_path_in_use(), CODEC_HALF_PORTABLE);
    ck_assert_str_eq(codec_simd_name(codec_simd_in_use()), "portable");
    codec_set_simd(was);
    ck_assert_int_eq(codec_simd_in_use(), was);
}
END_TEST

START_TEST(buf_string_quotes_and_escapes)
{
    codec_buf b = {0};
    codec_buf_string(&b, "a\"b\\c\n\x01 \xe2\x82\xac");
    codec_buf_puts(&b, ",");
    codec_buf_string(&b, "");
    ck_assert(!b.failed);
    ck_assert_str_eq(b.data, "\"a\\\"b\\\\c\\n\\u0001 \xe2\x82\xac\",\"\"");
    codec_buf_free(&b);
}
END_TEST

/* kernel: the case reads JSON through the validator or the tensor reader,
 * whose row classifier follows ATTN_KERNEL's width (api_codec_setup sets
 * the codec's, codec_set_simd), and make test runs it once per kernel (the
 * tag "kernel", tests/run-suites.sh). */
static TCase *tcase(Suite *s, const char *name, bool kernel)
{
    TCase *tc = tcase_create(name);
    if (kernel)
        tcase_set_tags(tc, "kernel");
    /* the property tests run ~1M cases; sanitizers slow them several-fold */
    tcase_set_timeout(tc, 600);
    suite_add_tcase(s, tc);
    return tc;
}

Suite *codec_suite(void)
{
    Suite *s = suite_create("codec");
    TCase *tc = tcase(s, "validator", true);
    tcase_add_test(tc, validator_matches_jsontestsuite_corpus);
    tcase_add_test(tc, validator_never_reads_past_the_end);
    tcase_add_test(tc, validator_rejects_what_rfc8259_forbids);
    tcase_add_test(tc, validator_error_names_offset_line_and_column);
    tcase_add_test(tc, validator_bounds_nesting_without_recursion);
    tcase_add_test(tc, validator_checks_every_byte_of_long_strings);
    tc = tcase(s, "objects", false);
    tcase_add_test(tc, skip_finds_the_end_of_each_value);
    tcase_add_test(tc, members_lists_decoded_keys_and_value_spans);
    tcase_add_test(tc, members_detects_duplicates_after_decoding);
    tcase_add_test(tc, members_refuses_non_objects_and_too_many_fields);
    tcase_add_test(tc, validator_notes_the_members_of_the_object);
    tc = tcase(s, "strings", false);
    tcase_add_test(tc, utf8_sequence_matches_reference_on_every_short_input);
    tcase_add_test(tc, utf8_valid_and_uncut_on_texts);
    tcase_add_test(tc, escape_text_reads_back_as_the_text_for_any_bytes);
    tcase_add_test(tc, escape_text_examples);
    tc = tcase(s, "decode", true);
    tcase_add_test(tc, decode_nested_ranks_two_to_four);
    tcase_add_test(tc, decode_long_rows_match_strtod);
    tcase_add_test(tc, decode_bool_masks_in_every_form);
    tcase_add_test(tc, decode_data_against_declared_dtype_says_so);
    tcase_add_test(tc, decode_flat_form);
    tcase_add_test(tc, decode_base64_form);
    tcase_add_test(tc, decode_empty_arrays_give_zero_dimensions);
    tcase_add_test(tc, decode_refuses_ragged_arrays);
    tcase_add_test(tc, decode_refuses_wrong_types);
    tcase_add_test(tc, decode_refuses_numbers_not_finite_as_float32);
    tcase_add_test(tc, decode_object_form_errors);
    tcase_add_test(tc, decode_base64_errors);
    tcase_add_test(tc, decode_checks_declared_shape_before_allocating);
    tcase_add_test(tc, decode_type_errors_come_before_shape_errors);
    tcase_add_test(tc, messages_quote_keys_whole_and_escaped);
    tc = tcase(s, "half", false);
    tcase_add_test(tc, half_widening_exact_for_every_pattern_and_path);
    tcase_add_test(tc, half_narrowing_rounds_to_nearest_even_on_every_path);
    tcase_add_test(tc, decode_half_base64_tensors);
    tcase_add_test(tc, raw_bytes_read_as_base64_bytes_are);
    tcase_add_test(tc, raw_bytes_viewed_in_place_and_checked_everywhere);
    tcase_add_test(tc, encode_half_base64_rounds_to_nearest_even);
    tc = tcase(s, "numbers", false);
    tcase_add_test(tc, parse_number_edge_cases);
    tcase_add_test(tc, parse_number_matches_strtod_on_random_texts);
    tcase_add_test(tc, parse_number_exact_where_rounding_is_close);
    tcase_add_test(tc, pow10_table_entries_are_right);
    tc = tcase(s, "format", false);
    tcase_add_test(tc, float_text_examples);
    tcase_add_test(tc, float_text_round_trips_every_kind_of_float);
    tcase_add_test(tc, float_text_is_shortest);
    tcase_add_test(tc, float_text_is_shortest_and_nearest);
    tc = tcase(s, "encode", false);
    tcase_add_test(tc, encode_forms_exact_text);
    tcase_add_test(tc, encode_decode_round_trip_bit_exact);
    tcase_add_test(tc, buf_grows_and_formats);
    tcase_add_test(tc, base64_rfc4648_vectors);
    tcase_add_test(tc, base64_paths_match_a_bit_by_bit_reference);
    tc = tcase(s, "rows", true);
    tcase_add_test(tc, row_scan_paths_classify_every_byte_and_sign_alike);
    tcase_add_test(tc, row_block_grammar_matches_a_reference_recognizer);
    tcase_add_test(tc, validator_accepts_long_rows_exactly_when_a_reference_does);
    tcase_add_test(tc, doc_tensor_reads_rows_from_the_notes_as_from_the_text);
    tcase_add_test(tc, blocks_resume_after_the_byte_that_ended_one);
    tcase_add_test(tc, short_rows_of_long_numbers_checked_in_every_number);
    tc = tcase(s, "robustness", true);
    tcase_add_test(tc, mutated_documents_never_crash);
    tc = tcase(s, "library", false);
    tcase_add_test(tc, codec_error_gives_the_place_of_the_fault);
    tcase_add_test(tc, parse_integer_decides_on_the_digits);
    tcase_add_test(tc, simd_switch_caps_the_width_in_use);
    tcase_add_test(tc, buf_string_quotes_and_escapes);
    return s;
}

int main(void)
{
    /* the codec's width follows ATTN_KERNEL, as the API layer sets it, so
     * that the suite run once per kernel runs each of its paths */
    api_codec_setup();
    SRunner *sr = srunner_create(codec_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
