/*
 * Tests for the IDX reader and the Fashion-MNIST loader (src/nn/idx.c): valid files in
 * memory, raw and gzipped on disk; one broken file per failure the reader must catch, each
 * checked for its code and for a message naming the file; and, where it is installed, the
 * real dataset. Temporary files go under RK_TEST_TMPDIR.
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "nn/idx.h"

#ifndef RK_TEST_TMPDIR
#define RK_TEST_TMPDIR "/tmp"
#endif

/* ---- helpers ---------------------------------------------------------------------------- */

/* Build an IDX file in a malloc'd buffer: magic 00 00 dtype ndim, dims, then `data`. */
static uint8_t *make_idx(int dtype, int ndim, const uint32_t *dims, const uint8_t *data,
                         size_t datalen, size_t *len)
{
    *len = 4 + 4 * (size_t)ndim + datalen;
    uint8_t *b = malloc(*len);
    assert_non_null(b);
    b[0] = 0;
    b[1] = 0;
    b[2] = (uint8_t)dtype;
    b[3] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++) {
        b[4 + 4 * i] = (uint8_t)(dims[i] >> 24);
        b[5 + 4 * i] = (uint8_t)(dims[i] >> 16);
        b[6 + 4 * i] = (uint8_t)(dims[i] >> 8);
        b[7 + 4 * i] = (uint8_t)dims[i];
    }
    if (datalen)
        memcpy(b + 4 + 4 * ndim, data, datalen);
    return b;
}

/* buf = dir/name, failing the test if it does not fit. */
static void join_path(char *buf, size_t size, const char *dir, const char *name)
{
    int k = snprintf(buf, size, "%s/%s", dir, name);
    assert_true(k > 0 && (size_t)k < size);
}

static void tmp_path(char *buf, size_t size, const char *name)
{
    join_path(buf, size, RK_TEST_TMPDIR, name);
}

/* An empty directory under RK_TEST_TMPDIR (files from an earlier run are removed). */
static void tmp_dir(char *buf, size_t size, const char *name)
{
    static const char *const files[] = {
        "train-images-idx3-ubyte",    "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte",
        "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte",     "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte",     "t10k-labels-idx1-ubyte.gz",
    };
    mkdir(RK_TEST_TMPDIR, 0700);
    tmp_path(buf, size, name);
    assert_true(mkdir(buf, 0700) == 0 || errno == EEXIST);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[1024];
        join_path(p, sizeof p, buf, files[i]);
        unlink(p);
    }
}

static void write_file(const char *path, const uint8_t *b, size_t len)
{
    mkdir(RK_TEST_TMPDIR, 0700);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void write_gz(const char *path, const uint8_t *b, size_t len)
{
    mkdir(RK_TEST_TMPDIR, 0700);
    gzFile gz = gzopen(path, "wb");
    assert_non_null(gz);
    assert_int_equal(gzwrite(gz, b, (unsigned)len), (int)len);
    assert_int_equal(gzclose(gz), Z_OK);
}

static uint8_t *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n > 0);
    rewind(f);
    uint8_t *b = malloc((size_t)n);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* Deterministic bytes that do not compress much (so cutting a gzip file cuts real data). */
static void fill_noise(uint8_t *b, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        b[i] = (uint8_t)(seed >> 24);
    }
}

static int is_zeroed_idx(const rk_idx *x)
{
    return x->dtype == 0 && x->ndim == 0 && x->nbytes == 0 && x->data == NULL && x->dims[0] == 0 &&
           x->dims[1] == 0 && x->dims[2] == 0 && x->dims[3] == 0;
}

/* The message is one line, names `file` and contains `what`. */
static void check_msg(const rk_err *err, int code, const char *file, const char *what)
{
    assert_int_equal(err->code, code);
    assert_null(strchr(err->msg, '\n'));
    if (!strstr(err->msg, file) || (what && !strstr(err->msg, what)))
        fail_msg("message \"%s\" should name \"%s\" and say \"%s\"", err->msg, file,
                 what ? what : "");
}

/* Write `b` to RK_TEST_TMPDIR/name, load it and expect `code` with a message naming it. */
static void expect_load_error(const char *name, const uint8_t *b, size_t len, int gz, int code,
                              const char *what)
{
    char path[1024];
    tmp_path(path, sizeof path, name);
    if (gz)
        write_gz(path, b, len);
    else
        write_file(path, b, len);
    rk_idx x;
    rk_err err;
    rk_err_clear(&err);
    assert_int_equal(rk_idx_load(path, &x, &err), code);
    assert_true(is_zeroed_idx(&x));
    check_msg(&err, code, name, what);
}

/* Parse `b` in memory and expect `code` with a message naming "mem.idx". */
static void expect_parse_error(const uint8_t *b, size_t len, int code, const char *what)
{
    rk_idx x;
    rk_err err;
    rk_err_clear(&err);
    assert_int_equal(rk_idx_parse(b, len, "mem.idx", &x, &err), code);
    assert_true(is_zeroed_idx(&x));
    check_msg(&err, code, "mem.idx", what);
}

/* ---- valid input ------------------------------------------------------------------------ */

static void parse_valid_idx3_gives_dims_and_a_copy_of_the_data(void **state)
{
    (void)state;
    uint8_t data[2 * 3 * 4];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)(i * 11);
    uint32_t dims[3] = {2, 3, 4};
    size_t len;
    uint8_t *b = make_idx(0x08, 3, dims, data, sizeof data, &len);
    rk_idx x;
    rk_err err;
    rk_err_clear(&err);
    assert_int_equal(rk_idx_parse(b, len, "ok.idx", &x, &err), RK_OK);
    free(b); /* the parsed data must be a copy */
    assert_int_equal(x.dtype, 0x08);
    assert_int_equal(x.ndim, 3);
    assert_int_equal(x.dims[0], 2);
    assert_int_equal(x.dims[1], 3);
    assert_int_equal(x.dims[2], 4);
    assert_int_equal(x.dims[3], 0);
    assert_int_equal(x.nbytes, sizeof data);
    assert_memory_equal(x.data, data, sizeof data);
    rk_idx_free(&x);
    assert_true(is_zeroed_idx(&x));
}

static void parse_valid_idx1_and_idx4(void **state)
{
    (void)state;
    uint8_t data[5] = {9, 8, 7, 6, 5};
    uint32_t d1[1] = {5};
    size_t len;
    uint8_t *b = make_idx(0x08, 1, d1, data, 5, &len);
    rk_idx x;
    assert_int_equal(rk_idx_parse(b, len, NULL, &x, NULL), RK_OK);
    assert_int_equal(x.ndim, 1);
    assert_int_equal(x.nbytes, 5);
    assert_memory_equal(x.data, data, 5);
    rk_idx_free(&x);
    free(b);

    uint8_t d4data[2 * 1 * 1 * 2] = {1, 2, 3, 4};
    uint32_t d4[4] = {2, 1, 1, 2};
    b = make_idx(0x08, 4, d4, d4data, 4, &len);
    assert_int_equal(rk_idx_parse(b, len, NULL, &x, NULL), RK_OK);
    assert_int_equal(x.ndim, 4);
    assert_int_equal(x.dims[3], 2);
    assert_memory_equal(x.data, d4data, 4);
    rk_idx_free(&x);
    free(b);
}

static void load_reads_raw_and_gzip_files_identically(void **state)
{
    (void)state;
    uint8_t data[7 * 9];
    fill_noise(data, sizeof data, 42);
    uint32_t dims[2] = {7, 9};
    size_t len;
    uint8_t *b = make_idx(0x08, 2, dims, data, sizeof data, &len);
    char raw[1024], gz[1024];
    tmp_path(raw, sizeof raw, "idx_valid-idx2-ubyte");
    tmp_path(gz, sizeof gz, "idx_valid-idx2-ubyte.gz");
    write_file(raw, b, len);
    write_gz(gz, b, len);
    free(b);
    for (int i = 0; i < 2; i++) {
        rk_idx x;
        rk_err err;
        rk_err_clear(&err);
        assert_int_equal(rk_idx_load(i ? gz : raw, &x, &err), RK_OK);
        assert_int_equal(err.code, RK_OK);
        assert_int_equal(x.ndim, 2);
        assert_int_equal(x.dims[0], 7);
        assert_int_equal(x.dims[1], 9);
        assert_int_equal(x.nbytes, sizeof data);
        assert_memory_equal(x.data, data, sizeof data);
        rk_idx_free(&x);
    }
}

static void free_functions_accept_zeroed_structs_and_null(void **state)
{
    (void)state;
    rk_idx x = {0};
    rk_dataset ds = {0};
    rk_idx_free(&x);
    rk_idx_free(NULL);
    rk_dataset_free(&ds);
    rk_dataset_free(NULL);
    assert_true(is_zeroed_idx(&x));
}

/* ---- malformed IDX, in memory ----------------------------------------------------------- */

static void parse_rejects_each_malformed_header_in_memory(void **state)
{
    (void)state;
    uint8_t data[4] = {1, 2, 3, 4};
    uint32_t dims[2] = {2, 2};
    size_t len;
    uint8_t *b = make_idx(0x08, 2, dims, data, 4, &len);

    expect_parse_error(b, 0, RK_EFORMAT, "truncated header");
    expect_parse_error(b, 3, RK_EFORMAT, "truncated header");
    expect_parse_error(b, 4 + 7, RK_EFORMAT, "truncated header");
    expect_parse_error(b, len - 1, RK_EFORMAT, "file has 3");

    b[1] = 0x01;
    expect_parse_error(b, len, RK_EFORMAT, "bad magic");
    b[0] = 0x1f;
    b[1] = 0x8b;
    expect_parse_error(b, len, RK_EFORMAT, "gzip");
    b[0] = b[1] = 0;
    b[2] = 0x0D; /* float: a valid IDX type we do not accept */
    expect_parse_error(b, len, RK_EFORMAT, "data type 0x0d");
    b[2] = 0x08;
    b[3] = 0;
    expect_parse_error(b, len, RK_EFORMAT, "dimensions 0");
    b[3] = 5;
    expect_parse_error(b, len, RK_EFORMAT, "dimensions 5");
    free(b);

    uint8_t ok[5] = {0, 0, 8, 1, 0};
    expect_parse_error(ok, sizeof ok, RK_EFORMAT, "truncated header");

    rk_idx x;
    rk_err err;
    assert_int_equal(rk_idx_parse(NULL, 10, "mem.idx", &x, &err), RK_EINVAL);
    assert_int_equal(rk_idx_parse(ok, 5, "mem.idx", NULL, &err), RK_EINVAL);
}

/* ---- malformed IDX files on disk -------------------------------------------------------- */

static void load_rejects_bad_magic(void **state)
{
    (void)state;
    uint8_t b[12] = {0x12, 0x34, 0x08, 0x01, 0, 0, 0, 4, 1, 2, 3, 4};
    expect_load_error("idx_badmagic-idx1-ubyte", b, sizeof b, 0, RK_EFORMAT,
                      "bad magic 12 34 08 01");
}

static void load_rejects_non_ubyte_dtype(void **state)
{
    (void)state;
    uint8_t b[12] = {0, 0, 0x0B, 0x01, 0, 0, 0, 2, 1, 2, 3, 4}; /* 0x0B: int16 */
    expect_load_error("idx_dtype-idx1-ubyte", b, sizeof b, 0, RK_EFORMAT, "data type 0x0b");
}

static void load_rejects_ndim_outside_1_to_4(void **state)
{
    (void)state;
    uint8_t b[4] = {0, 0, 0x08, 0};
    expect_load_error("idx_ndim0-idx1-ubyte", b, sizeof b, 0, RK_EFORMAT, "dimensions 0");
    uint8_t c[4 + 20 + 1] = {0, 0, 0x08, 5, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1};
    c[23] = 1;
    expect_load_error("idx_ndim5-idx1-ubyte", c, sizeof c, 0, RK_EFORMAT, "dimensions 5");
}

static void load_rejects_truncated_header(void **state)
{
    (void)state;
    uint8_t b[10] = {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0}; /* 3 dims need 12 bytes of sizes */
    expect_load_error("idx_shorthdr-idx3-ubyte", b, sizeof b, 0, RK_EFORMAT,
                      "truncated header: 6 of the 12 bytes");
    expect_load_error("idx_shortmagic-idx3-ubyte", b, 2, 0, RK_EFORMAT,
                      "truncated header: file has 2 bytes");
    expect_load_error("idx_empty-idx3-ubyte", b, 0, 0, RK_EFORMAT, "truncated header");
}

static void load_rejects_truncated_data_saying_expected_and_found_bytes(void **state)
{
    (void)state;
    uint8_t data[1200] = {0};
    uint32_t dims[3] = {60000, 28, 28};
    size_t len;
    uint8_t *b = make_idx(0x08, 3, dims, data, sizeof data, &len);
    expect_load_error("idx_shortdata-idx3-ubyte", b, len, 0, RK_EFORMAT,
                      "truncated: header says 60000x28x28 = 47040000 bytes of data, file has "
                      "1200");
    expect_load_error("idx_shortdata-idx3-ubyte.gz", b, len, 1, RK_EFORMAT,
                      "47040000 bytes of data, file has 1200");
    free(b);
}

static void load_rejects_trailing_bytes_after_the_data(void **state)
{
    (void)state;
    uint8_t data[2 * 2 + 3] = {1, 2, 3, 4, 0xAA, 0xBB, 0xCC};
    uint32_t dims[2] = {2, 2};
    size_t len;
    uint8_t *b = make_idx(0x08, 2, dims, data, sizeof data, &len);
    expect_load_error("idx_trailing-idx2-ubyte", b, len, 0, RK_EFORMAT, "3 trailing bytes");
    expect_load_error("idx_trailing-idx2-ubyte.gz", b, len, 1, RK_EFORMAT, "3 trailing bytes");
    free(b);
}

static void load_rejects_dims_whose_product_overflows_or_exceeds_the_cap(void **state)
{
    (void)state;
    uint8_t huge[4 + 16] = {0, 0, 0x08, 4};
    memset(huge + 4, 0xFF, 16); /* 4294967295^4: overflows 64 bits */
    expect_load_error("idx_overflow-idx4-ubyte", huge, sizeof huge, 0, RK_EFORMAT,
                      "too large: header says 4294967295x4294967295x4294967295x4294967295");
    /* 2000x1000x1000 = 2e9 bytes: no overflow, but over the 1 GiB cap. */
    uint32_t dims[3] = {2000, 1000, 1000};
    size_t len;
    uint8_t *b = make_idx(0x08, 3, dims, NULL, 0, &len);
    expect_load_error("idx_cap-idx3-ubyte", b, len, 0, RK_EFORMAT, "too large");
    free(b);
    /* Exactly at the cap passes the header check (then fails as truncated, having allocated
     * only as much as the file held). */
    uint32_t at_cap[3] = {1024, 1024, 1024};
    b = make_idx(0x08, 3, at_cap, NULL, 0, &len);
    expect_load_error("idx_atcap-idx3-ubyte", b, len, 0, RK_EFORMAT,
                      "1073741824 bytes of data, file has 0");
    free(b);
}

static void load_rejects_a_zero_dimension(void **state)
{
    (void)state;
    uint32_t dims[3] = {5, 0, 28};
    size_t len;
    uint8_t *b = make_idx(0x08, 3, dims, NULL, 0, &len);
    expect_load_error("idx_zerodim-idx3-ubyte", b, len, 0, RK_EFORMAT,
                      "dimension 1 of 5x0x28 is zero");
    free(b);
}

/* A small valid IDX file, gzipped, as bytes (caller frees). */
static uint8_t *valid_gz_bytes(size_t *gzlen)
{
    uint8_t data[40 * 40];
    fill_noise(data, sizeof data, 7);
    uint32_t dims[2] = {40, 40};
    size_t len;
    uint8_t *b = make_idx(0x08, 2, dims, data, sizeof data, &len);
    char path[1024];
    tmp_path(path, sizeof path, "idx_src.gz");
    write_gz(path, b, len);
    free(b);
    return read_file(path, gzlen);
}

static void load_rejects_corrupt_gzip_with_the_zlib_error(void **state)
{
    (void)state;
    size_t n;
    uint8_t *gz = valid_gz_bytes(&n);
    assert_true(n > 18);
    gz[n - 8] ^= 0xFF; /* CRC-32 in the trailer */
    expect_load_error("idx_badcrc-idx2-ubyte.gz", gz, n, 0, RK_EFORMAT,
                      "corrupt gzip stream: incorrect data check");
    gz[n - 8] ^= 0xFF;
    gz[10] = 0x07; /* first deflate block: BFINAL=1, BTYPE=11 (reserved) */
    expect_load_error("idx_badblock-idx2-ubyte.gz", gz, n, 0, RK_EFORMAT,
                      "corrupt gzip stream: invalid block type");
    free(gz);
}

static void load_rejects_truncated_gzip(void **state)
{
    (void)state;
    size_t n;
    uint8_t *gz = valid_gz_bytes(&n);
    expect_load_error("idx_halfgz-idx2-ubyte.gz", gz, n / 2, 0, RK_EFORMAT,
                      "truncated gzip stream");
    /* All the data is there, only the 8-byte CRC/length trailer is cut. */
    expect_load_error("idx_notrailer-idx2-ubyte.gz", gz, n - 4, 0, RK_EFORMAT,
                      "truncated gzip stream");
    /* Only the gzip header. */
    expect_load_error("idx_gzhdr-idx2-ubyte.gz", gz, 10, 0, RK_EFORMAT, "gzip stream");
    free(gz);
}

static void load_reports_missing_file_as_enoent_naming_the_path(void **state)
{
    (void)state;
    char path[1024];
    tmp_path(path, sizeof path, "idx_does_not_exist-idx1-ubyte");
    unlink(path);
    rk_idx x;
    rk_err err;
    assert_int_equal(rk_idx_load(path, &x, &err), RK_ENOENT);
    assert_true(is_zeroed_idx(&x));
    check_msg(&err, RK_ENOENT, path, "not found");
}

/* Only a regular file is read: a directory, a FIFO (the open must not block: the alarm fails
 * the test if it does) and /dev/zero (endless data) are refused before a byte is read. */
static void load_refuses_what_is_not_a_regular_file(void **state)
{
    (void)state;
    rk_idx x;
    rk_err err;
    assert_int_equal(rk_idx_load(RK_TEST_TMPDIR, &x, &err), RK_EINVAL);
    assert_true(is_zeroed_idx(&x));
    check_msg(&err, RK_EINVAL, RK_TEST_TMPDIR, "is a directory, not a regular file");
    char fifo[600];
    snprintf(fifo, sizeof fifo, "%s/idx_fifo.%ld", RK_TEST_TMPDIR, (long)getpid());
    unlink(fifo);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(20);
    assert_int_equal(rk_idx_load(fifo, &x, &err), RK_EINVAL);
    check_msg(&err, RK_EINVAL, fifo, "is a FIFO, not a regular file");
    assert_int_equal(rk_idx_load("/dev/zero", &x, &err), RK_EINVAL);
    check_msg(&err, RK_EINVAL, "/dev/zero", "is a character device");
    alarm(0);
    unlink(fifo);
}

/* ---- the Fashion-MNIST loader ----------------------------------------------------------- */

enum { SYN_N = 3, PIX = 28 * 28 };
static const uint8_t syn_labels[SYN_N] = {0, 9, 5};

static uint8_t syn_pixel(size_t i)
{
    return (uint8_t)(i * 7 + i / 5);
}

/* Write images (n x rows x cols) and labels for `prefix` into dir; gz picks the format. */
static void write_split(const char *dir, const char *prefix, int gz, uint32_t n_img, uint32_t rows,
                        uint32_t cols, const uint8_t *labels, uint32_t n_lab)
{
    size_t npix = (size_t)n_img * rows * cols, len;
    uint8_t *pix = malloc(npix);
    assert_non_null(pix);
    for (size_t i = 0; i < npix; i++)
        pix[i] = syn_pixel(i);
    uint32_t idims[3] = {n_img, rows, cols};
    uint8_t *b = make_idx(0x08, 3, idims, pix, npix, &len);
    char path[1024], name[64];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte%s", prefix, gz ? ".gz" : "");
    join_path(path, sizeof path, dir, name);
    if (gz)
        write_gz(path, b, len);
    else
        write_file(path, b, len);
    free(b);
    free(pix);
    uint32_t ldims[1] = {n_lab};
    b = make_idx(0x08, 1, ldims, labels, n_lab, &len);
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte%s", prefix, gz ? ".gz" : "");
    join_path(path, sizeof path, dir, name);
    if (gz)
        write_gz(path, b, len);
    else
        write_file(path, b, len);
    free(b);
}

static float normalised(int v)
{
    return ((float)v / 255.0f - 0.2860f) / 0.3530f;
}

/* The loader keeps the file's bytes, its lut maps each byte to (v/255 - 0.2860)/0.3530, and
 * rk_dataset_images gives exactly lut[byte] for any range of images, nothing outside it. */
static void check_synthetic(const rk_dataset *ds)
{
    assert_int_equal(ds->n, SYN_N);
    assert_int_equal(ds->rows, 28);
    assert_int_equal(ds->cols, 28);
    assert_memory_equal(ds->labels, syn_labels, SYN_N);
    for (size_t i = 0; i < (size_t)SYN_N * PIX; i++)
        if (ds->pixels[i] != syn_pixel(i))
            fail_msg("pixel %zu: got byte %u, want %u", i, ds->pixels[i], syn_pixel(i));
    for (int v = 0; v < 256; v++)
        if (fabsf(ds->lut[v] - normalised(v)) > 1e-6f)
            fail_msg("lut[%d]: got %f, want %f", v, (double)ds->lut[v], (double)normalised(v));
    /* Spot values: 0 -> -0.2860/0.3530, 255 -> (1-0.2860)/0.3530. */
    assert_true(fabsf(ds->lut[0] - (-0.2860f / 0.3530f)) < 1e-6f);
    assert_true(fabsf(ds->lut[255] - ((1.0f - 0.2860f) / 0.3530f)) < 1e-6f);

    /* All images, then images 1..2 alone, into a buffer with a guard value either side. */
    static float buf[1 + SYN_N * PIX + 1];
    const float guard = -1234.5f;
    for (int first = 0; first < 2; first++) {
        int count = SYN_N - first;
        for (size_t i = 0; i < sizeof buf / sizeof buf[0]; i++)
            buf[i] = guard;
        rk_dataset_images(ds, first, count, buf + 1);
        assert_true(buf[0] == guard);
        assert_true(buf[1 + (size_t)count * PIX] == guard);
        for (size_t i = 0; i < (size_t)count * PIX; i++) {
            float want = ds->lut[syn_pixel((size_t)first * PIX + i)];
            if (memcmp(&buf[1 + i], &want, sizeof want) != 0)
                fail_msg("images from %d, value %zu: got %f, want %f", first, i, (double)buf[1 + i],
                         (double)want);
        }
    }
    buf[1] = guard;
    rk_dataset_images(ds, SYN_N, 0, buf + 1); /* an empty range writes nothing */
    assert_true(buf[1] == guard);
}

static void dataset_loads_raw_synthetic_split_and_normalises_pixels(void **state)
{
    (void)state;
    char dir[1024];
    tmp_dir(dir, sizeof dir, "idx_ds_raw");
    write_split(dir, "train", 0, SYN_N, 28, 28, syn_labels, SYN_N);
    rk_dataset ds;
    rk_err err;
    rk_err_clear(&err);
    assert_int_equal(rk_dataset_load_fmnist(dir, 1, &ds, &err), RK_OK);
    check_synthetic(&ds);
    rk_dataset_free(&ds);
    assert_null(ds.pixels);
    /* The test split is a different file set: absent here. */
    assert_int_equal(rk_dataset_load_fmnist(dir, 0, &ds, &err), RK_ENOENT);
    check_msg(&err, RK_ENOENT, "t10k-images-idx3-ubyte", "not found");
}

static void dataset_loads_gzip_split_and_prefers_gz_over_raw(void **state)
{
    (void)state;
    char dir[1024];
    tmp_dir(dir, sizeof dir, "idx_ds_gz");
    write_split(dir, "t10k", 1, SYN_N, 28, 28, syn_labels, SYN_N);
    /* Raw files with other labels beside them: the .gz ones must win. */
    static const uint8_t other[SYN_N] = {1, 1, 1};
    write_split(dir, "t10k", 0, SYN_N, 28, 28, other, SYN_N);
    rk_dataset ds;
    rk_err err;
    assert_int_equal(rk_dataset_load_fmnist(dir, 0, &ds, &err), RK_OK);
    check_synthetic(&ds);
    rk_dataset_free(&ds);

    /* Mixed: gzip images, raw labels. */
    char path[1024];
    join_path(path, sizeof path, dir, "t10k-labels-idx1-ubyte.gz");
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rk_dataset_load_fmnist(dir, 0, &ds, &err), RK_OK);
    assert_memory_equal(ds.labels, other, SYN_N);
    rk_dataset_free(&ds);
}

static void expect_dataset_error(const char *dirname, int code, const char *file, const char *what)
{
    char dir[1024];
    tmp_path(dir, sizeof dir, dirname);
    rk_dataset ds;
    rk_err err;
    rk_err_clear(&err);
    assert_int_equal(rk_dataset_load_fmnist(dir, 1, &ds, &err), code);
    assert_int_equal(ds.n, 0);
    assert_null(ds.pixels);
    assert_null(ds.labels);
    check_msg(&err, code, file, what);
}

static void dataset_rejects_label_out_of_range(void **state)
{
    (void)state;
    char dir[1024];
    tmp_dir(dir, sizeof dir, "idx_ds_badlabel");
    static const uint8_t bad[SYN_N] = {3, 10, 4};
    write_split(dir, "train", 1, SYN_N, 28, 28, bad, SYN_N);
    expect_dataset_error("idx_ds_badlabel", RK_EFORMAT, "train-labels-idx1-ubyte.gz",
                         "label 10 at index 1 is out of range");
}

static void dataset_rejects_image_and_label_count_mismatch(void **state)
{
    (void)state;
    char dir[1024];
    tmp_dir(dir, sizeof dir, "idx_ds_count");
    static const uint8_t two[2] = {1, 2};
    write_split(dir, "train", 0, SYN_N, 28, 28, two, 2);
    expect_dataset_error("idx_ds_count", RK_EFORMAT, "train-labels-idx1-ubyte", "2 labels, but");
}

static void dataset_rejects_images_that_are_not_28x28(void **state)
{
    (void)state;
    char dir[1024];
    tmp_dir(dir, sizeof dir, "idx_ds_shape");
    write_split(dir, "train", 0, SYN_N, 28, 27, syn_labels, SYN_N);
    expect_dataset_error("idx_ds_shape", RK_EFORMAT, "train-images-idx3-ubyte",
                         "must be 28x28, header says 3x28x27");
}

static void dataset_rejects_wrong_ndim_for_images_and_labels(void **state)
{
    (void)state;
    char dir[1024], path[1024];
    tmp_dir(dir, sizeof dir, "idx_ds_ndim");
    write_split(dir, "train", 0, SYN_N, 28, 28, syn_labels, SYN_N);
    /* Labels as a 2-D array. */
    uint32_t ld[2] = {SYN_N, 1};
    size_t len;
    uint8_t *b = make_idx(0x08, 2, ld, syn_labels, SYN_N, &len);
    join_path(path, sizeof path, dir, "train-labels-idx1-ubyte");
    write_file(path, b, len);
    free(b);
    expect_dataset_error("idx_ds_ndim", RK_EFORMAT, "train-labels-idx1-ubyte",
                         "labels must have 1 dimension, header says 3x1");
    /* Images flattened to 1-D. */
    uint8_t pix[2 * PIX] = {0};
    uint32_t id[1] = {2 * PIX};
    b = make_idx(0x08, 1, id, pix, sizeof pix, &len);
    join_path(path, sizeof path, dir, "train-images-idx3-ubyte");
    write_file(path, b, len);
    free(b);
    expect_dataset_error("idx_ds_ndim", RK_EFORMAT, "train-images-idx3-ubyte",
                         "images must have 3 dimensions");
}

static void dataset_reports_missing_labels_naming_both_paths_tried(void **state)
{
    (void)state;
    char dir[1024], path[1024];
    tmp_dir(dir, sizeof dir, "idx_ds_nolabels");
    write_split(dir, "train", 1, SYN_N, 28, 28, syn_labels, SYN_N);
    join_path(path, sizeof path, dir, "train-labels-idx1-ubyte.gz");
    assert_int_equal(unlink(path), 0);
    expect_dataset_error("idx_ds_nolabels", RK_ENOENT, "train-labels-idx1-ubyte.gz",
                         "train-labels-idx1-ubyte)");
    expect_dataset_error("idx_ds_no_such_dir", RK_ENOENT, "idx_ds_no_such_dir", "not found");
}

static void dataset_passes_on_errors_from_a_broken_file(void **state)
{
    (void)state;
    char dir[1024], path[1024];
    tmp_dir(dir, sizeof dir, "idx_ds_broken");
    write_split(dir, "train", 1, SYN_N, 28, 28, syn_labels, SYN_N);
    size_t n;
    join_path(path, sizeof path, dir, "train-images-idx3-ubyte.gz");
    uint8_t *gz = read_file(path, &n);
    write_file(path, gz, n / 2);
    free(gz);
    expect_dataset_error("idx_ds_broken", RK_EFORMAT, "train-images-idx3-ubyte.gz", "gzip stream");
}

/* ---- the real dataset, when installed --------------------------------------------------- */

static void check_real_split(int train, int n)
{
    struct stat st;
    if (stat(RK_FMNIST_DEFAULT_DIR, &st) != 0) {
        print_message("skipped: %s not found; install Fashion-MNIST there to run this test\n",
                      RK_FMNIST_DEFAULT_DIR);
        skip();
    }
    rk_dataset ds;
    rk_err err;
    rk_err_clear(&err);
    int rc = rk_dataset_load_fmnist(RK_FMNIST_DEFAULT_DIR, train, &ds, &err);
    if (rc)
        fail_msg("%s", err.msg);
    assert_int_equal(ds.n, n);
    assert_int_equal(ds.rows, 28);
    assert_int_equal(ds.cols, 28);
    int hist[10] = {0};
    for (int i = 0; i < ds.n; i++)
        hist[ds.labels[i]]++;
    for (int c = 0; c < 10; c++)
        assert_int_equal(hist[c], n / 10);
    /* The normalisation constants are the training set's mean and std: check them on what
     * the model sees, the floats from rk_dataset_images, a chunk of images at a time. */
    enum { CHUNK = 1000 };
    float *x = malloc((size_t)CHUNK * PIX * sizeof *x);
    assert_non_null(x);
    double sum = 0, sq = 0;
    size_t npix = (size_t)ds.n * PIX;
    for (int first = 0; first < ds.n; first += CHUNK) {
        int count = ds.n - first < CHUNK ? ds.n - first : CHUNK;
        rk_dataset_images(&ds, first, count, x);
        for (size_t i = 0; i < (size_t)count * PIX; i++) {
            sum += x[i];
            sq += (double)x[i] * x[i];
        }
    }
    free(x);
    double mean = sum / (double)npix, sd = sqrt(sq / (double)npix - mean * mean);
    if (fabs(mean) > 0.01 || fabs(sd - 1.0) > 0.01)
        fail_msg("normalised pixels have mean %f, std %f; want about 0 and 1", mean, sd);
    rk_dataset_free(&ds);
}

static void real_fmnist_train_has_60000_examples_6000_per_class(void **state)
{
    (void)state;
    check_real_split(1, 60000);
}

static void real_fmnist_test_has_10000_examples_1000_per_class(void **state)
{
    (void)state;
    check_real_split(0, 10000);
}

/* The decoded cache (rk_idx_load_cached): a miss writes the entry, the next load reads it
 * with the same bytes; an entry whose data was changed, that is a link, or whose source was
 * rewritten is never used (a miss, the source's data). */
static void cached_load_hits_and_never_serves_stale_or_spoilt(void **state)
{
    (void)state;
    char dir[1024], cache[1100], src[1100];
    tmp_dir(dir, sizeof dir, "idx_cache");
    join_path(cache, sizeof cache, dir, "cache");
    mkdir(cache, 0700);
    DIR *d = opendir(cache); /* what an earlier run left */
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d))) {
        char p[1300];
        if (de->d_name[0] != '.') {
            join_path(p, sizeof p, cache, de->d_name);
            unlink(p);
        }
    }
    closedir(d);
    join_path(src, sizeof src, dir, "train-images-idx3-ubyte.gz");
    enum { N = 4096 };
    uint8_t data[N];
    for (size_t i = 0; i < N; i++)
        data[i] = (uint8_t)(i * 7 + 3);
    uint32_t dims[3] = {4, 32, 32};
    size_t len;
    uint8_t *file = make_idx(RK_IDX_UBYTE, 3, dims, data, N, &len);
    write_gz(src, file, len);
    rk_idx x;
    rk_err err;
    int hit = 7;
    /* no cache directory: the plain load */
    assert_int_equal(rk_idx_load_cached(src, NULL, &x, &hit, &err), RK_OK);
    assert_int_equal(hit, 0);
    rk_idx_free(&x);
    assert_int_equal(rk_idx_load_cached(src, cache, &x, &hit, &err), RK_OK);
    assert_int_equal(hit, -1); /* read from the source, entry written */
    assert_memory_equal(x.data, data, N);
    rk_idx_free(&x);
    assert_int_equal(rk_idx_load_cached(src, cache, &x, &hit, &err), RK_OK);
    assert_int_equal(hit, 1);
    assert_int_equal(x.ndim, 3);
    assert_int_equal(x.dims[0], 4);
    assert_int_equal(x.dims[2], 32);
    assert_int_equal(x.nbytes, N);
    assert_memory_equal(x.data, data, N);
    rk_idx_free(&x);

    /* the one entry, its last data byte changed: the hash fails, a miss, the true data */
    d = opendir(cache);
    assert_non_null(d);
    char entry[1200] = "";
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, RK_IDX_CACHE_PREFIX, strlen(RK_IDX_CACHE_PREFIX)))
            join_path(entry, sizeof entry, cache, de->d_name);
    closedir(d);
    assert_true(entry[0]);
    size_t elen;
    uint8_t *e = read_file(entry, &elen);
    e[elen - 1] ^= 0x40;
    write_file(entry, e, elen);
    assert_int_equal(rk_idx_load_cached(src, cache, &x, &hit, &err), RK_OK);
    assert_int_equal(hit, -1); /* rewritten */
    assert_memory_equal(x.data, data, N);
    rk_idx_free(&x);
    assert_int_equal(rk_idx_load_cached(src, cache, &x, &hit, &err), RK_OK);
    assert_int_equal(hit, 1);
    rk_idx_free(&x);

    /* the entry replaced by a link to a good copy of itself: never followed */
    char copy[1300];
    snprintf(copy, sizeof copy, "%s.copy", entry);
    free(e);
    e = read_file(entry, &elen);
    write_file(copy, e, elen);
    assert_int_equal(unlink(entry), 0);
    assert_int_equal(symlink(copy, entry), 0);
    assert_int_equal(rk_idx_load_cached(src, cache, &x, &hit, &err), RK_OK);
    assert_int_not_equal(hit, 1);
    assert_memory_equal(x.data, data, N);
    rk_idx_free(&x);

    /* the source rewritten with other data: another key, the new data */
    data[0] ^= 0xff;
    free(file);
    file = make_idx(RK_IDX_UBYTE, 3, dims, data, N, &len);
    unlink(src);
    write_gz(src, file, len);
    assert_int_equal(rk_idx_load_cached(src, cache, &x, &hit, &err), RK_OK);
    assert_int_equal(hit, -1);
    assert_memory_equal(x.data, data, N);
    rk_idx_free(&x);
    /* a missing source is RK_ENOENT, cache or not */
    unlink(src);
    assert_int_equal(rk_idx_load_cached(src, cache, &x, &hit, &err), RK_ENOENT);
    assert_null(x.data);
    free(e);
    free(file);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parse_valid_idx3_gives_dims_and_a_copy_of_the_data),
        cmocka_unit_test(parse_valid_idx1_and_idx4),
        cmocka_unit_test(load_reads_raw_and_gzip_files_identically),
        cmocka_unit_test(free_functions_accept_zeroed_structs_and_null),
        cmocka_unit_test(parse_rejects_each_malformed_header_in_memory),
        cmocka_unit_test(load_rejects_bad_magic),
        cmocka_unit_test(load_rejects_non_ubyte_dtype),
        cmocka_unit_test(load_rejects_ndim_outside_1_to_4),
        cmocka_unit_test(load_rejects_truncated_header),
        cmocka_unit_test(load_rejects_truncated_data_saying_expected_and_found_bytes),
        cmocka_unit_test(load_rejects_trailing_bytes_after_the_data),
        cmocka_unit_test(load_rejects_dims_whose_product_overflows_or_exceeds_the_cap),
        cmocka_unit_test(load_rejects_a_zero_dimension),
        cmocka_unit_test(load_rejects_corrupt_gzip_with_the_zlib_error),
        cmocka_unit_test(load_rejects_truncated_gzip),
        cmocka_unit_test(load_reports_missing_file_as_enoent_naming_the_path),
        cmocka_unit_test(load_refuses_what_is_not_a_regular_file),
        cmocka_unit_test(dataset_loads_raw_synthetic_split_and_normalises_pixels),
        cmocka_unit_test(dataset_loads_gzip_split_and_prefers_gz_over_raw),
        cmocka_unit_test(dataset_rejects_label_out_of_range),
        cmocka_unit_test(dataset_rejects_image_and_label_count_mismatch),
        cmocka_unit_test(dataset_rejects_images_that_are_not_28x28),
        cmocka_unit_test(dataset_rejects_wrong_ndim_for_images_and_labels),
        cmocka_unit_test(dataset_reports_missing_labels_naming_both_paths_tried),
        cmocka_unit_test(dataset_passes_on_errors_from_a_broken_file),
        cmocka_unit_test(cached_load_hits_and_never_serves_stale_or_spoilt),
        cmocka_unit_test(real_fmnist_train_has_60000_examples_6000_per_class),
        cmocka_unit_test(real_fmnist_test_has_10000_examples_1000_per_class),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
