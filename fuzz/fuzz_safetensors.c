/*
 * libFuzzer target for the safetensors reader (rk_st_parse, and rk_st_read's header-first
 * path on the same bytes in a memfd). Any input must be rejected cleanly or parse into
 * tensors that lie inside the buffer; reading it as a file must give the same verdict, code
 * and message (but for the name); a parsed file is then re-encoded with rk_st_encode and
 * parsed again, and both must agree (writer and reader round trip).
 */
#define _GNU_SOURCE /* memfd_create */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rekindle/safetensors.h"

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

/* Encode `f` again, parse the result and require the same tensors, data and metadata. */
static void round_trip(const rk_st_file *f)
{
    for (size_t i = 0; i < f->ntensors; i++)
        if (f->tensors[i].name[0] == '\0')
            return; /* valid to read, refused by the writer */
    rk_st_entry *e = calloc(f->ntensors ? f->ntensors : 1, sizeof *e);
    const char **meta = calloc(2 * f->nmeta + 1, sizeof *meta);
    check(e && meta);
    for (size_t i = 0; i < f->ntensors; i++) {
        const rk_st_tensor *t = &f->tensors[i];
        e[i] = (rk_st_entry){t->name, t->data, t->ndim, t->shape, t->dtype};
    }
    for (size_t i = 0; i < f->nmeta; i++) {
        meta[2 * i] = f->meta_keys[i];
        meta[2 * i + 1] = f->meta_vals[i];
    }
    uint8_t *buf;
    size_t len;
    rk_err err;
    check(rk_st_encode(e, f->ntensors, f->nmeta ? meta : NULL, &buf, &len, &err) == RK_OK);
    rk_st_file g;
    check(rk_st_parse(buf, len, "re-encoded", &g, &err) == RK_OK);
    check(g.data_start % 8 == 0);
    check(g.ntensors == f->ntensors && g.nmeta == f->nmeta);
    for (size_t i = 0; i < g.ntensors; i++) {
        const rk_st_tensor *a = &f->tensors[i], *b = &g.tensors[i];
        check(strcmp(a->name, b->name) == 0 && strcmp(a->dtype, b->dtype) == 0);
        check(a->ndim == b->ndim && a->nbytes == b->nbytes && a->numel == b->numel);
        check(memcmp(a->shape, b->shape, sizeof a->shape[0] * (size_t)a->ndim) == 0);
        check(a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0);
    }
    for (size_t i = 0; i < g.nmeta; i++) {
        const char *v = rk_st_meta(&g, f->meta_keys[i]);
        check(v && strcmp(v, f->meta_vals[i]) == 0);
    }
    free(buf);
    rk_st_free(&g);
    free(meta);
    free(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* rk_st_read of the same bytes as a file (named "fuzz" through /proc/self/fd/N would change
 * the message, so compare codes and, on success, the tensors). */
static void read_as_file(const uint8_t *data, size_t size, int want_rc, const rk_st_file *want)
{
    static int fd = -2;
    if (fd == -2)
        fd = memfd_create("fuzz_safetensors", 0);
    if (fd < 0)
        return;
    check(ftruncate(fd, 0) == 0 && lseek(fd, 0, SEEK_SET) == 0);
    for (size_t done = 0; done < size;) {
        ssize_t n = write(fd, data + done, size - done);
        check(n > 0);
        done += (size_t)n;
    }
    check(lseek(fd, 0, SEEK_SET) == 0);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    rk_st_file g;
    rk_err err;
    int rc = rk_st_read(path, &g, &err);
    if (want_rc == RK_ENOMEM || rc == RK_ENOMEM)
        return;
    check(rc == want_rc);
    if (rc < 0) {
        check(memchr(err.msg, '\n', strlen(err.msg)) == NULL);
        return;
    }
    check(g.len == want->len && g.ntensors == want->ntensors && g.nmeta == want->nmeta);
    check(memcmp(g.buf, want->buf, g.len) == 0);
    for (size_t i = 0; i < g.ntensors; i++)
        check(strcmp(g.tensors[i].name, want->tensors[i].name) == 0 &&
              g.tensors[i].data - g.buf == want->tensors[i].data - want->buf);
    rk_st_free(&g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rk_st_file f;
    rk_err err;
    int rc = rk_st_parse(data, size, "fuzz", &f, &err);
    read_as_file(data, size, rc, &f);
    if (rc < 0) {
        check(rc == RK_EFORMAT || rc == RK_ENOMEM);
        check(memchr(err.msg, '\n', strlen(err.msg)) == NULL);
        return 0;
    }
    size_t covered = 0;
    for (size_t i = 0; i < f.ntensors; i++) {
        const rk_st_tensor *t = &f.tensors[i];
        check(t->data >= f.buf + f.data_start && t->data + t->nbytes <= f.buf + f.len);
        check(rk_st_find(&f, t->name) == t);
        check(t->nbytes == t->numel * rk_st_dtype_size(t->dtype));
        covered += t->nbytes;
    }
    check(covered == f.len - f.data_start);
    for (size_t i = 0; i < f.nmeta; i++)
        check(rk_st_meta(&f, f.meta_keys[i]) == f.meta_vals[i]);
    round_trip(&f);
    rk_st_free(&f);
    return 0;
}
