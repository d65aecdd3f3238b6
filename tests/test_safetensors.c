/*
 * Tests for rekindle/safetensors.h: the exact bytes the writer produces (what Python's
 * safetensors reads), round trips through disk, every kind of malformed header rejected with
 * RK_EFORMAT and a one-line message naming file and problem, every truncation of a valid file
 * rejected, and writer argument errors that leave the target untouched.
 */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/bytes.h"
#include "rekindle/fileio.h"
#include "rekindle/safetensors.h"
#include "testutil.h"

RK_TEST_DIR_FIXTURE("test_safetensors")

static const char *in_dir(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
    return buf;
}

static int dir_entries(void)
{
    DIR *d = opendir(g_dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* A file with header length `hlen`, the bytes of `header`, then `data_len` data bytes. */
static uint8_t *make_file(uint64_t hlen, const char *header, size_t data_len, size_t *len)
{
    size_t hl = strlen(header);
    *len = 8 + hl + data_len;
    uint8_t *b = calloc(1, *len);
    assert_non_null(b);
    rk_le64_store(b, hlen);
    memcpy(b + 8, header, hl);
    for (size_t i = 0; i < data_len; i++)
        b[8 + hl + i] = (uint8_t)(i * 7 + 1);
    return b;
}

/* Parse bytes that must be rejected; the message must name the file and contain `want`. */
static void expect_bad_bytes(const uint8_t *buf, size_t len, const char *want)
{
    rk_err err;
    rk_st_file f;
    memset(&f, 0xab, sizeof f);
    int rc = rk_st_parse(buf, len, "bad.safetensors", &f, &err);
    if (rc != RK_EFORMAT || !strstr(err.msg, want) || !strstr(err.msg, "bad.safetensors"))
        print_error("rc=%d msg='%s' want='%s'\n", rc, rc < 0 ? err.msg : "", want);
    assert_int_equal(rc, RK_EFORMAT);
    assert_int_equal(err.code, RK_EFORMAT);
    assert_non_null(strstr(err.msg, "bad.safetensors"));
    assert_non_null(strstr(err.msg, want));
    assert_null(strchr(err.msg, '\n'));
    assert_null(f.buf); /* zeroed: nothing to free */
    assert_null(f.tensors);
    assert_int_equal(f.ntensors, 0);
}

static void expect_bad(const char *header, size_t data_len, const char *want)
{
    size_t len;
    uint8_t *b = make_file(strlen(header), header, data_len, &len);
    expect_bad_bytes(b, len, want);
    free(b);
}

#define F32_2 "{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"

static void test_baseline_of_broken_cases_is_valid(void **state)
{
    (void)state;
    /* The broken headers below are each one change away from this valid file. */
    size_t len;
    uint8_t *b = make_file(strlen("{\"a\":" F32_2 "}"), "{\"a\":" F32_2 "}", 8, &len);
    rk_st_file f;
    rk_err err;
    assert_int_equal(rk_st_parse(b, len, "ok.safetensors", &f, &err), RK_OK);
    assert_int_equal(f.ntensors, 1);
    assert_string_equal(f.tensors[0].name, "a");
    assert_int_equal(f.tensors[0].nbytes, 8);
    assert_memory_equal(f.tensors[0].data, b + len - 8, 8);
    rk_st_free(&f);
    free(b);
}

static void test_rejects_bad_lengths(void **state)
{
    (void)state;
    const uint8_t tiny[5] = {1, 0, 0, 0, 0};
    expect_bad_bytes(tiny, sizeof tiny, "shorter than the 8-byte");
    expect_bad_bytes(NULL, 0, "file is 0 bytes");

    size_t len;
    uint8_t *b = make_file(1000, "{}", 0, &len);
    expect_bad_bytes(b, len, "runs past the end");
    free(b);
    b = make_file(200000000, "{}", 0, &len);
    expect_bad_bytes(b, len, "over the limit");
    free(b);
    b = make_file(UINT64_MAX, "{}", 0, &len);
    expect_bad_bytes(b, len, "over the limit");
    free(b);
    b = make_file(0, "", 4, &len);
    expect_bad_bytes(b, len, "header length is 0");
    free(b);
}

static void test_rejects_bad_json(void **state)
{
    (void)state;
    expect_bad("{\"a\": {\"dtype\": \"F32\",", 0, "not valid JSON");
    expect_bad("{} trailing", 0, "not valid JSON");
    expect_bad("[\"a\"]", 0, "not a JSON object");
    expect_bad(" {}", 0, "not a JSON object");
    expect_bad("\"{}\"", 0, "not a JSON object");
    expect_bad("{\"a\xff\":" F32_2 "}", 8, "not valid UTF-8");
    expect_bad("{\"a\xc0\x80\":" F32_2 "}", 8, "not valid UTF-8"); /* overlong NUL */
    expect_bad("{\"a\\u0000b\":" F32_2 "}", 8, "not valid JSON");  /* escaped NUL */
    expect_bad("{\"a\":" F32_2 ",\"a\":" F32_2 "}", 8,
               "duplicate key in header: tensor 'a' appears twice");
    expect_bad("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate key in header");
}

static void test_rejects_bad_entries(void **state)
{
    (void)state;
    static const struct {
        const char *header;
        size_t data_len;
        const char *want;
    } cases[] = {
        {"{\"a\":5}", 8, "tensor 'a': entry is not a JSON object"},
        {"{\"a\":[]}", 8, "tensor 'a': entry is not a JSON object"},
        {"{\"a\":{\"dtype\":\"F128\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         "tensor 'a': unknown dtype 'F128'"},
        {"{\"a\":{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         "unknown dtype 'f32'"},
        {"{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         "tensor 'a': 'dtype' is not a string"},
        {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor 'a': missing field 'dtype'"},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "missing field 'shape'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "missing field 'data_offsets'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"extra\":1}}", 8,
         "tensor 'a': unknown field 'extra'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8,
         "'shape' is not an array"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
         "'shape'[0] is not a non-negative integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,2.0],\"data_offsets\":[0,8]}}", 8,
         "'shape'[1] is not a non-negative integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8,
         "'shape'[0] is not a non-negative integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8,
         "'shape' has 9 dimensions, more than 8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,2],\"data_offsets\":[0,8]}}",
         8, "'shape' element count overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,8]}}", 8,
         "'shape' byte size overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":8}}", 8,
         "'data_offsets' is not an array of two integers"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}", 8,
         "'data_offsets' is not an array of two integers"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,\"8\"]}}", 8,
         "'data_offsets' are not non-negative integers"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-1,7]}}", 8,
         "'data_offsets' are not non-negative integers"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
         "'data_offsets' begin 8 is after end 0"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
         "'data_offsets' end 16 is past the end of the data section (8 bytes)"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
         "'data_offsets' span 8 bytes but F32 [3] needs 12"},
        {"{\"a\":{\"dtype\":\"F64\",\"shape\":[2,1],\"data_offsets\":[0,8]}}", 8,
         "span 8 bytes but F64 [2,1] needs 16"},
        {"{\"a\":" F32_2 ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
         "tensors 'a' and 'b' overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
         12, "tensor 'b': hole in the data section, bytes 4..8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
         "tensor 'a': hole in the data section, bytes 0..4"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
         "data section is 8 bytes but the tensors cover only 4"},
        {"{}", 4, "data section is 4 bytes but the tensors cover only 0"},
        {"{\"a\":" F32_2 ",\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8,
         "tensors 'a' and 'z' overlap"},
        {"{\"__metadata__\":5}", 0, "'__metadata__' is not a JSON object"},
        {"{\"__metadata__\":[\"k\",\"v\"]}", 0, "'__metadata__' is not a JSON object"},
        {"{\"__metadata__\":{\"k\":1}}", 0, "'__metadata__': value of 'k' is not a string"},
        {"{\"__metadata__\":{\"k\":null}}", 0, "value of 'k' is not a string"},
        /* A name with a newline is shown with '?' so the message stays one line. */
        {"{\"a\\nb\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         "tensor 'a?b': unknown dtype 'Q4'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_bad(cases[i].header, cases[i].data_len, cases[i].want);
}

static int64_t shp_23[] = {2, 3}, shp_3[] = {3}, shp_0x4[] = {0, 4}, shp_2[] = {2};

static void test_round_trip_through_disk(void **state)
{
    (void)state;
    float w[6] = {0.0f, 0.5f, -1.0f, 1.5f, 2.0f, -2.5f};
    float b[3] = {1e-30f, 3.25f, -0.0f};
    float s = 42.0f;
    int64_t iv[2] = {-1, (int64_t)1 << 40};
    uint8_t u[3] = {1, 2, 3};
    rk_st_entry t[] = {
        {"fc1.weight", w, 2, shp_23, NULL}, {"fc1.bias", b, 1, shp_3, NULL},
        {"scale", &s, 0, NULL, "F32"},      {"empty", NULL, 2, shp_0x4, NULL},
        {"step", iv, 1, shp_2, "I64"},      {"bytes", u, 1, shp_3, "U8"},
    };
    const char *meta[] = {"format", "rekindle-model", "arch", "mlp 784-128-10 \"q\" é", NULL};
    char p[1024];
    rk_err err;
    in_dir(p, sizeof p, "model.safetensors");
    assert_int_equal(rk_st_write(p, t, 6, meta, &err), RK_OK);

    rk_st_file f;
    assert_int_equal(rk_st_read(p, &f, &err), RK_OK);
    assert_string_equal(f.name, p);
    assert_int_equal(f.ntensors, 6);
    for (size_t i = 0; i < 6; i++) {
        const rk_st_tensor *r = &f.tensors[i];
        assert_string_equal(r->name, t[i].name); /* written order is kept */
        assert_string_equal(r->dtype, t[i].dtype ? t[i].dtype : "F32");
        assert_int_equal(r->ndim, t[i].ndim);
        size_t numel = 1;
        for (int d = 0; d < r->ndim; d++) {
            assert_int_equal(r->shape[d], t[i].shape[d]);
            numel *= (size_t)t[i].shape[d];
        }
        assert_int_equal(r->numel, numel);
        assert_int_equal(r->nbytes, numel * rk_st_dtype_size(r->dtype));
        if (r->nbytes)
            assert_memory_equal(r->data, t[i].data, r->nbytes);
        assert_ptr_equal(rk_st_find(&f, t[i].name), r);
    }
    assert_null(rk_st_find(&f, "nope"));
    assert_int_equal(f.nmeta, 2);
    assert_string_equal(f.meta_keys[0], "format");
    assert_string_equal(rk_st_meta(&f, "format"), "rekindle-model");
    assert_string_equal(rk_st_meta(&f, "arch"), meta[3]);
    assert_null(rk_st_meta(&f, "nope"));

    /* Data section aligned to 8, header padded with spaces after the JSON. */
    assert_int_equal(f.data_start % 8, 0);
    assert_int_equal(rk_le64_load(f.buf), f.data_start - 8);
    assert_int_equal(f.buf[f.data_start - 1] == ' ' || f.buf[f.data_start - 1] == '}', 1);
    assert_int_equal(f.len, f.data_start + 24 + 12 + 4 + 0 + 16 + 3);
    /* F32 tensors in our own files are aligned for direct float access. */
    assert_int_equal((uintptr_t)f.tensors[0].data % 4, 0);

    /* Encoding in memory gives exactly the bytes on disk. */
    uint8_t *enc;
    size_t enc_len;
    assert_int_equal(rk_st_encode(t, 6, meta, &enc, &enc_len, &err), RK_OK);
    assert_int_equal(enc_len, f.len);
    assert_memory_equal(enc, f.buf, enc_len);
    free(enc);
    rk_st_free(&f);
    rk_st_free(&f); /* zeroed by the first call */
    rk_st_free(NULL);
}

/* rk_st_read_fd: a large file (the huge-page buffer) read from an open descriptor gives the
 * same bytes as rk_st_read; a size that is not the file's is refused, nothing kept. */
static void test_read_fd_large_and_wrong_size(void **state)
{
    (void)state;
    enum { N = (9 << 20) / 4 }; /* 9 MiB of float32: past the huge-page threshold */
    float *w = malloc((size_t)N * sizeof *w);
    assert_non_null(w);
    for (size_t i = 0; i < N; i++)
        w[i] = (float)(i % 977) * 0.25f - 100.0f;
    int64_t shp[1] = {N};
    rk_st_entry t[] = {{"w", w, 1, shp, NULL}, {"b", w + 7, 1, shp_3, NULL}};
    char p[1024];
    rk_err err;
    in_dir(p, sizeof p, "big.safetensors");
    assert_int_equal(rk_st_write(p, t, 2, NULL, &err), RK_OK);
    rk_st_file a, b;
    assert_int_equal(rk_st_read(p, &a, &err), RK_OK);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(rk_st_read_fd(fd, "label", (uint64_t)st.st_size, &b, &err), RK_OK);
    assert_string_equal(b.name, "label");
    assert_int_equal(b.len, a.len);
    assert_memory_equal(b.buf, a.buf, a.len);
    assert_memory_equal(rk_st_find(&b, "w")->data, w, (size_t)N * sizeof *w);
    rk_st_free(&b);
    /* one byte short of the file: the data section no longer matches the header's */
    assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
    assert_int_equal(rk_st_read_fd(fd, "label", (uint64_t)st.st_size - 1, &b, &err), RK_EFORMAT);
    assert_null(b.buf);
    /* one byte more than the file: a short read */
    assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
    assert_true(rk_st_read_fd(fd, "label", (uint64_t)st.st_size + 1, &b, &err) < 0);
    assert_null(b.buf);
    close(fd);
    rk_st_free(&a);
    free(w);
}

/* The exact bytes: what Python's safetensors expects, pinned. */
static void test_exact_layout(void **state)
{
    (void)state;
    float x = 1.0f;
    int64_t one[] = {1};
    rk_st_entry t[] = {{"x", &x, 1, one, NULL}};
    const char *meta[] = {"k", "v", NULL};
    uint8_t *buf;
    size_t len;
    rk_err err;
    assert_int_equal(rk_st_encode(t, 1, meta, &buf, &len, &err), RK_OK);
    const char *json = "{\"__metadata__\":{\"k\":\"v\"},\"x\":{\"dtype\":\"F32\",\"shape\":[1],"
                       "\"data_offsets\":[0,4]}}";
    size_t jl = strlen(json), padded = (jl + 7) / 8 * 8;
    assert_int_equal(len, 8 + padded + 4);
    assert_int_equal(rk_le64_load(buf), padded);
    assert_memory_equal(buf + 8, json, jl);
    for (size_t i = jl; i < padded; i++)
        assert_int_equal(buf[8 + i], ' ');
    const uint8_t one_f32_le[4] = {0x00, 0x00, 0x80, 0x3f};
    assert_memory_equal(buf + 8 + padded, one_f32_le, 4);
    free(buf);

    /* No tensors, no metadata: "{}" padded to 8 bytes. */
    assert_int_equal(rk_st_encode(NULL, 0, NULL, &buf, &len, &err), RK_OK);
    assert_int_equal(len, 16);
    assert_memory_equal(buf, "\x08\0\0\0\0\0\0\0{}      ", 16);
    rk_st_file f;
    assert_int_equal(rk_st_parse(buf, len, NULL, &f, &err), RK_OK);
    assert_int_equal(f.ntensors, 0);
    assert_int_equal(f.nmeta, 0);
    assert_string_equal(f.name, "<memory>");
    rk_st_free(&f);
    free(buf);
}

/* Files from other writers: unpadded header, header order unlike data order, empty tensors. */
static void test_accepts_other_writers_layout(void **state)
{
    (void)state;
    const char *h = "{\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[5,6]},"
                    "\"e\":{\"dtype\":\"BF16\",\"shape\":[0,3],\"data_offsets\":[1,1]},"
                    "\"a\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[0,1]},"
                    "\"c\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[1,5]},"
                    "\"__metadata__\":{}}";
    size_t len;
    uint8_t *b = make_file(strlen(h), h, 6, &len);
    rk_st_file f;
    rk_err err;
    assert_int_equal(rk_st_parse(b, len, "other.safetensors", &f, &err), RK_OK);
    assert_int_equal(f.ntensors, 4);
    assert_string_equal(f.tensors[0].name, "a");
    assert_string_equal(f.tensors[1].name, "e");
    assert_string_equal(f.tensors[2].name, "c");
    assert_string_equal(f.tensors[3].name, "b");
    assert_int_equal(f.tensors[0].ndim, 0);
    assert_int_equal(f.tensors[0].numel, 1);
    assert_int_equal(f.tensors[1].numel, 0);
    assert_int_equal(f.tensors[3].offset, 5);
    assert_ptr_equal(f.tensors[3].data, f.buf + f.data_start + 5);
    assert_int_equal(f.tensors[3].data[0], b[len - 1]);
    assert_int_equal(f.nmeta, 0);
    rk_st_free(&f);
    free(b);
}

/* Every proper prefix of a valid file is rejected, without crashing or leaking. */
static void test_every_truncation_rejected(void **state)
{
    (void)state;
    float w[4] = {1, 2, 3, 4};
    int64_t s22[] = {2, 2};
    int8_t tail[1] = {-5};
    int64_t s1[] = {1};
    rk_st_entry t[] = {{"w", w, 2, s22, NULL}, {"t", tail, 1, s1, "I8"}};
    const char *meta[] = {"epoch", "3", NULL};
    uint8_t *buf;
    size_t len;
    rk_err err;
    assert_int_equal(rk_st_encode(t, 2, meta, &buf, &len, &err), RK_OK);
    rk_st_file f;
    assert_int_equal(rk_st_parse(buf, len, "full", &f, &err), RK_OK);
    rk_st_free(&f);
    for (size_t n = 0; n < len; n++) {
        uint8_t *cut = malloc(n ? n : 1); /* exact size, so ASan sees any over-read */
        memcpy(cut, buf, n);
        int rc = rk_st_parse(cut, n, "cut.safetensors", &f, &err);
        if (rc != RK_EFORMAT)
            print_error("length %zu of %zu: rc=%d\n", n, len, rc);
        assert_int_equal(rc, RK_EFORMAT);
        assert_non_null(strstr(err.msg, "cut.safetensors"));
        assert_null(strchr(err.msg, '\n'));
        free(cut);
    }
    free(buf);
}

static void test_read_missing_and_not_safetensors(void **state)
{
    (void)state;
    char p[1024];
    rk_err err;
    rk_st_file f;
    in_dir(p, sizeof p, "absent.safetensors");
    assert_int_equal(rk_st_read(p, &f, &err), RK_ENOENT);
    assert_null(f.buf);
    in_dir(p, sizeof p, "text.safetensors");
    assert_int_equal(rk_file_write_atomic(p, "hello world, not a model\n", 25, &err), RK_OK);
    assert_int_equal(rk_st_read(p, &f, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, p));
    assert_null(f.buf);
}

static void expect_write_einval(const rk_st_entry *t, size_t n, const char *const *meta,
                                const char *want)
{
    char p[1024];
    rk_err err;
    in_dir(p, sizeof p, "bad-write.safetensors");
    int before = dir_entries();
    int rc = rk_st_write(p, t, n, meta, &err);
    if (rc != RK_EINVAL || !strstr(err.msg, want))
        print_error("rc=%d msg='%s' want='%s'\n", rc, err.msg, want);
    assert_int_equal(rc, RK_EINVAL);
    assert_non_null(strstr(err.msg, want));
    assert_non_null(strstr(err.msg, p));
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(dir_entries(), before); /* no temporary file either */
    uint8_t *buf = (uint8_t *)1;
    size_t len;
    assert_int_equal(rk_st_encode(t, n, meta, &buf, &len, &err), RK_EINVAL);
    assert_null(buf);
}

static void test_writer_rejects_bad_entries(void **state)
{
    (void)state;
    float d[4] = {0};
    int64_t neg[] = {-1}, nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, big[] = {INT64_MAX, 4};
    rk_st_entry dup[] = {{"a", d, 1, shp_2, NULL}, {"a", d, 1, shp_2, NULL}};
    expect_write_einval(dup, 2, NULL, "tensor name 'a' appears twice");
    rk_st_entry reserved[] = {{"__metadata__", d, 1, shp_2, NULL}};
    expect_write_einval(reserved, 1, NULL, "is reserved");
    rk_st_entry noname[] = {{NULL, d, 1, shp_2, NULL}};
    expect_write_einval(noname, 1, NULL, "tensor #0 has no name");
    rk_st_entry empty[] = {{"", d, 1, shp_2, NULL}};
    expect_write_einval(empty, 1, NULL, "has no name");
    rk_st_entry badutf[] = {{"a\xff", d, 1, shp_2, NULL}};
    expect_write_einval(badutf, 1, NULL, "not valid UTF-8");
    rk_st_entry toomany[] = {{"a", d, 9, nine, NULL}};
    expect_write_einval(toomany, 1, NULL, "tensor 'a': ndim 9 is outside 0..8");
    rk_st_entry negdim[] = {{"a", d, 1, neg, NULL}};
    expect_write_einval(negdim, 1, NULL, "shape[0] is negative");
    rk_st_entry overflow[] = {{"a", d, 2, big, NULL}};
    expect_write_einval(overflow, 1, NULL, "overflows");
    rk_st_entry dtype[] = {{"a", d, 1, shp_2, "F128"}};
    expect_write_einval(dtype, 1, NULL, "unknown dtype 'F128'");
    rk_st_entry nodata[] = {{"a", NULL, 1, shp_2, NULL}};
    expect_write_einval(nodata, 1, NULL, "data is NULL");
    rk_st_entry noshape[] = {{"a", d, 1, NULL, NULL}};
    expect_write_einval(noshape, 1, NULL, "shape is NULL");
    expect_write_einval(NULL, 1, NULL, "list is NULL");

    rk_st_entry ok[] = {{"a", d, 1, shp_2, NULL}};
    const char *novalue[] = {"k", NULL};
    expect_write_einval(ok, 1, novalue, "metadata key 'k' has no value");
    const char *dupkey[] = {"k", "1", "k", "2", NULL};
    expect_write_einval(ok, 1, dupkey, "metadata key 'k' appears twice");
    const char *badval[] = {"k", "\xc3", NULL};
    expect_write_einval(ok, 1, badval, "not UTF-8");
}

/* A failed write leaves the previous file whole. */
static void test_failed_write_keeps_previous_file(void **state)
{
    (void)state;
    char p[1024];
    rk_err err;
    float d[2] = {7, 8};
    rk_st_entry ok[] = {{"a", d, 1, shp_2, NULL}};
    in_dir(p, sizeof p, "keep.safetensors");
    assert_int_equal(rk_st_write(p, ok, 1, NULL, &err), RK_OK);
    uint8_t *before;
    size_t before_len;
    assert_int_equal(rk_file_read_all(p, &before, &before_len, SIZE_MAX, &err), RK_OK);

    rk_st_entry bad[] = {{"b", d, 1, shp_2, NULL}, {"b", d, 1, shp_2, NULL}};
    assert_int_equal(rk_st_write(p, bad, 2, NULL, &err), RK_EINVAL);
    uint8_t *after;
    size_t after_len;
    assert_int_equal(rk_file_read_all(p, &after, &after_len, SIZE_MAX, &err), RK_OK);
    assert_int_equal(after_len, before_len);
    assert_memory_equal(after, before, before_len);
    free(before);
    free(after);

    in_dir(p, sizeof p, "no/such/dir.safetensors");
    assert_int_equal(rk_st_write(p, ok, 1, NULL, &err), RK_ENOENT);
}

static void test_load_f32(void **state)
{
    (void)state;
    float w[6] = {1, 2, 3, 4, 5, 6};
    int64_t iv[2] = {1, 2};
    rk_st_entry t[] = {{"w", w, 2, shp_23, NULL}, {"i", iv, 1, shp_2, "I64"}};
    uint8_t *buf;
    size_t len;
    rk_err err;
    assert_int_equal(rk_st_encode(t, 2, NULL, &buf, &len, &err), RK_OK);
    rk_st_file f;
    assert_int_equal(rk_st_parse(buf, len, "m.safetensors", &f, &err), RK_OK);
    free(buf);

    float out[6] = {0};
    assert_int_equal(rk_st_load_f32(&f, "w", 2, shp_23, out, &err), RK_OK);
    assert_memory_equal(out, w, sizeof w);

    assert_int_equal(rk_st_load_f32(&f, "nope", 2, shp_23, out, &err), RK_ENOENT);
    assert_non_null(strstr(err.msg, "m.safetensors: no tensor 'nope'"));
    int64_t s32[] = {3, 2};
    assert_int_equal(rk_st_load_f32(&f, "w", 2, s32, out, &err), RK_EMISMATCH);
    assert_non_null(strstr(err.msg, "tensor 'w' has shape [2,3], expected [3,2]"));
    assert_int_equal(rk_st_load_f32(&f, "w", 1, shp_23, out, &err), RK_EMISMATCH);
    assert_int_equal(rk_st_load_f32(&f, "i", 1, shp_2, out, &err), RK_EMISMATCH);
    assert_non_null(strstr(err.msg, "tensor 'i' is I64, expected F32"));
    rk_st_free(&f);
}

static void test_dtype_sizes(void **state)
{
    (void)state;
    assert_int_equal(rk_st_dtype_size("F32"), 4);
    assert_int_equal(rk_st_dtype_size("BF16"), 2);
    assert_int_equal(rk_st_dtype_size("F64"), 8);
    assert_int_equal(rk_st_dtype_size("BOOL"), 1);
    assert_int_equal(rk_st_dtype_size("F8_E4M3"), 1);
    assert_int_equal(rk_st_dtype_size("F4"), 0);
    assert_int_equal(rk_st_dtype_size(NULL), 0);
}

/* ---- bounded reading: header first, memory a small multiple of the file's content -------- */

/* a sanitizer's shadow memory and allocator make RSS no measure of the reader's (AddressSanitizer
 * or ThreadSanitizer: the bound is checked in the plain build) */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RK_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define RK_UNDER_SANITIZER 1
#endif
#endif

typedef struct read_job {
    const char *path;
    int want_rc;      /* what rk_st_read must return */
    const char *want; /* in its message (NULL: nothing checked) */
    size_t ntensors;  /* on success */
} read_job;

static int do_read(void *arg)
{
    const read_job *j = arg;
    rk_st_file f;
    rk_err err = {0};
    int rc = rk_st_read(j->path, &f, &err);
    if (rc != j->want_rc || (j->want && !strstr(err.msg, j->want)) ||
        (rc == RK_OK && f.ntensors != j->ntensors)) {
        fprintf(stderr, "rk_st_read: rc=%d msg='%s' (want %d '%s')\n", rc, err.msg, j->want_rc,
                j->want ? j->want : "");
        return 1;
    }
    rk_st_free(&f);
    return 0;
}

static int do_nothing(void *arg)
{
    (void)arg;
    return 0;
}

/* Run fn(arg) in a child; its peak resident memory in KiB (the child's own, from wait4), and
 * its exit status (fn's result; 99 if it died) in *status. */
static long child_peak_kib(int (*fn)(void *), void *arg, int *status)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fn(arg));
    int st;
    struct rusage ru;
    assert_int_equal(wait4(pid, &st, 0, &ru), pid);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : 99;
    return ru.ru_maxrss;
}

/* A file of `size` bytes (sparse beyond the header): length `hlen`, then `header`. */
static void write_sparse(const char *p, uint64_t hlen, const char *header, off_t size)
{
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    uint8_t lb[8];
    rk_le64_store(lb, hlen);
    assert_int_equal(write(fd, lb, 8), 8);
    size_t hl = strlen(header);
    assert_int_equal(write(fd, header, hl), (ssize_t)hl);
    assert_int_equal(ftruncate(fd, size), 0);
    close(fd);
}

/* A 3 GB sparse file whose header is bogus, or valid but not describing the data, is refused
 * after reading the 8-byte length and the header: the reader's peak memory stays within 64 MiB
 * of a child that does nothing (reading the file first costs 3 GB). */
static void test_huge_sparse_file_refused_from_its_header(void **state)
{
    (void)state;
    char p[1024];
    in_dir(p, sizeof p, "sparse.safetensors");
    const off_t size = (off_t)3 << 30;
    int st;
    long base = child_peak_kib(do_nothing, NULL, &st);
    assert_int_equal(st, 0);

    write_sparse(p, 0x7fffffffffffull, "", size); /* bogus length */
    read_job j = {p, RK_EFORMAT, "header length is over the limit", 0};
    long peak = child_peak_kib(do_read, &j, &st);
    assert_int_equal(st, 0);
    assert_true(peak - base < 64 * 1024);

    write_sparse(p, 2, "{}", size); /* a valid header with no tensors */
    j = (read_job){p, RK_EFORMAT, "data section is 3221225462 bytes but the tensors cover only 0",
                   0};
    peak = child_peak_kib(do_read, &j, &st);
    assert_int_equal(st, 0);
    assert_true(peak - base < 64 * 1024);

    write_sparse(p, 64, "{\"a\":{\"dtype\":\"U8\",\"shape\":[3221225400],", size);
    j = (read_job){p, RK_EFORMAT, "not valid JSON", 0};
    peak = child_peak_kib(do_read, &j, &st);
    assert_int_equal(st, 0);
    assert_true(peak - base < 64 * 1024);
    unlink(p);
}

/* A header of many zero-size tensors (about 24 MB of JSON, 400000 entries) is read with peak
 * memory under 8 times the file's size above a child that does nothing. Loading the header as
 * one jansson tree took about 20 times (an 87 MB header: 1.8 GB). */
static void test_many_empty_tensors_memory_is_bounded(void **state)
{
    (void)state;
    const size_t n = 400000;
    size_t cap = n * 64 + 16, used = 0;
    char *h = malloc(cap);
    assert_non_null(h);
    h[used++] = '{';
    for (size_t i = 0; i < n; i++)
        used += (size_t)snprintf(
            h + used, cap - used,
            "%s\"t%07zu\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}", i ? "," : "",
            i);
    h[used++] = '}';
    h[used] = '\0';
    char p[1024];
    in_dir(p, sizeof p, "empty-tensors.safetensors");
    write_sparse(p, used, h, (off_t)(8 + used));
    free(h);
    int st;
    long base = child_peak_kib(do_nothing, NULL, &st);
    read_job j = {p, RK_OK, NULL, n};
    long peak = child_peak_kib(do_read, &j, &st);
    assert_int_equal(st, 0);
    long file_kib = (long)((8 + used) / 1024);
    print_message("header %zu bytes: peak %ld KiB above a child doing nothing (%.1fx)\n", used,
                  peak - base, (double)(peak - base) / (double)file_kib);
#ifndef RK_UNDER_SANITIZER /* see above: resident memory means nothing there */
    assert_true(peak - base < 8 * file_kib);
#endif
    unlink(p);
}

/* A FIFO or a device given as a model is refused without blocking, naming the file. */
static void test_read_refuses_fifo_and_device(void **state)
{
    (void)state;
    char p[1024];
    in_dir(p, sizeof p, "fifo.safetensors");
    assert_int_equal(mkfifo(p, 0600), 0);
    rk_st_file f;
    rk_err err;
    alarm(20); /* a blocking open would hang here: the alarm fails the test instead */
    assert_int_equal(rk_st_read(p, &f, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "is a FIFO, not a regular file"));
    assert_non_null(strstr(err.msg, p));
    assert_int_equal(rk_st_read("/dev/zero", &f, &err), RK_EINVAL);
    assert_string_equal(err.msg, "/dev/zero: is a character device, not a regular file");
    alarm(0);
    assert_null(f.buf);
}

/* Messages about a file that is not safetensors quote none of its bytes (not even as the
 * number its first 8 bytes make). */
static void test_messages_quote_no_content(void **state)
{
    (void)state;
    static const char *const secrets[] = {
        "root:$6$saltsalt$hashhashhash:19000:0:99999:7:::\n",
        "\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":SECRETTOKEN}\n",
        "\x10\x00\x00\x00\x00\x00\x00\x00[SECRETTOKEN___]\n",
        "\x18\x00\x00\x00\x00\x00\x00\x00{\"SECRETTOKEN\":1 ,2}    ",
    };
    for (size_t i = 0; i < sizeof secrets / sizeof secrets[0]; i++) {
        size_t len = i == 0 ? strlen(secrets[i]) : 8 + strlen(secrets[i] + 8);
        rk_st_file f;
        rk_err err;
        int rc = rk_st_parse((const uint8_t *)secrets[i], len, "x.safetensors", &f, &err);
        assert_int_equal(rc, RK_EFORMAT);
        char num[32];
        uint64_t v = 0;
        memcpy(&v, secrets[i], 8);
        snprintf(num, sizeof num, "%llu", (unsigned long long)v);
        if (strstr(err.msg, "SECRET") || strstr(err.msg, "root") || strstr(err.msg, num))
            print_error("case %zu quotes content: %s\n", i, err.msg);
        assert_null(strstr(err.msg, "SECRET"));
        assert_null(strstr(err.msg, "root"));
        assert_null(strstr(err.msg, num));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_baseline_of_broken_cases_is_valid),
        cmocka_unit_test(test_read_fd_large_and_wrong_size),
        cmocka_unit_test(test_rejects_bad_lengths),
        cmocka_unit_test(test_rejects_bad_json),
        cmocka_unit_test(test_rejects_bad_entries),
        cmocka_unit_test(test_round_trip_through_disk),
        cmocka_unit_test(test_exact_layout),
        cmocka_unit_test(test_accepts_other_writers_layout),
        cmocka_unit_test(test_every_truncation_rejected),
        cmocka_unit_test(test_read_missing_and_not_safetensors),
        cmocka_unit_test(test_writer_rejects_bad_entries),
        cmocka_unit_test(test_failed_write_keeps_previous_file),
        cmocka_unit_test(test_load_f32),
        cmocka_unit_test(test_dtype_sizes),
        cmocka_unit_test(test_huge_sparse_file_refused_from_its_header),
        cmocka_unit_test(test_many_empty_tensors_memory_is_bounded),
        cmocka_unit_test(test_read_refuses_fifo_and_device),
        cmocka_unit_test(test_messages_quote_no_content),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
