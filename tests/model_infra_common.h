/* Helpers shared by the models/ tests (test_model*.c): a temporary directory per program, a leak
 * check around each test, whole-file reads and writes. */
#ifndef DG_TESTS_MODEL_INFRA_COMMON_H
#define DG_TESTS_MODEL_INFRA_COMMON_H

#include "tests/support/test_support.h"

#include "core/internal.h"

#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char tmpdir[64];

/* tmpdir/name in one of 8 rotating buffers: a path stays valid for the next 7 calls */
static inline const char *tmp_path(const char *name) {
    static char bufs[8][256];
    static int k;
    char *b = bufs[k++ & 7];
    snprintf(b, 256, "%s/%s", tmpdir, name);
    return b;
}

static inline int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }

static inline int setup(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dg_model_infra_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}
static inline int teardown(void **state) { return nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* every test must leave as many tensors alive as it found */
static size_t live_at_start;
static inline int test_setup(void **state) {
    dg_clear_error();
    live_at_start = dg_live_tensors();
    return 0;
}
static inline int test_teardown(void **state) {
    if (dg_live_tensors() != live_at_start) fail_msg("leaked %zu tensors", dg_live_tensors() - live_at_start);
    return 0;
}

static inline void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static inline unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

#endif
