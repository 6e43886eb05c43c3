/*
 * The fuzzer's findings, kept: every input in tests/fuzz/regressions/ (what
 * `make fuzz` once found breaking something), tests/fuzz/corpus/ (the
 * minimised inputs that reach the paths it explored) and the JSONTestSuite
 * documents goes through api_handle() for both operations, and every answer
 * must keep the invariants of tests/support/api_invariants.c. Under the
 * sanitizer pass of `make test` this is the fuzz target replayed without
 * libFuzzer.
 */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/api_invariants.h"

static const char *srcdir(void)
{
    const char *p = getenv("ATTND_SRCDIR");
    return p && *p ? p : ".";
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n == cap) {
            char *p = realloc(buf, cap = cap ? cap * 2 : 4096);
            if (!p) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = p;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    fclose(f);
    *len = n;
    return buf;
}

/* Replays every regular file of dir; returns how many there were. A file
 * that breaks an invariant fails the test, naming the file and the reason. */
static int replay_dir(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "cannot open %s (run from the repository root or set ATTND_SRCDIR)",
                  dir);
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "LICENSE") ||
            !strcmp(e->d_name, "README.md"))
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t len = 0;
        char *body = read_file(path, &len);
        ck_assert_msg(body != NULL, "cannot read %s", path);
        char why[400];
        bool ok = api_invariants_check(body, len, why, sizeof why);
        free(body);
        ck_assert_msg(ok, "%s: %s", path, why);
        files++;
    }
    closedir(d);
    return files;
}

START_TEST(fuzz_regressions_keep_every_invariant)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/regressions", srcdir());
    replay_dir(dir);
}
END_TEST

START_TEST(fuzz_corpus_keeps_every_invariant)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus", srcdir());
    ck_assert_msg(replay_dir(dir) > 0, "the fuzz corpus %s is empty", dir);
}
END_TEST

START_TEST(json_test_suite_keeps_every_invariant)
{
    const char *data = getenv("ATTND_TESTDATA");
    char dir[512];
    if (data && *data)
        snprintf(dir, sizeof dir, "%s/json_parsing", data);
    else
        snprintf(dir, sizeof dir, "%s/tests/data/json_parsing", srcdir());
    ck_assert_msg(replay_dir(dir) > 300, "JSONTestSuite corpus %s incomplete", dir);
}
END_TEST

static Suite *fuzz_suite(void)
{
    Suite *s = suite_create("fuzz");
    TCase *tc = tcase_create("replay");
    /* The inputs go through the whole pipeline, the validator's row
     * classifier and libattn's kernel included: make test replays them once
     * per kernel (the tag "kernel", tests/run-suites.sh). */
    tcase_set_tags(tc, "kernel");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, fuzz_regressions_keep_every_invariant);
    tcase_add_test(tc, fuzz_corpus_keeps_every_invariant);
    tcase_add_test(tc, json_test_suite_keeps_every_invariant);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(fuzz_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
