/*
 * IDX files (the MNIST / Fashion-MNIST container) and the Fashion-MNIST dataset.
 *
 * An IDX file is a 4-byte magic (0x00 0x00 <dtype> <ndim>), ndim big-endian uint32 dimensions,
 * then the data, row-major. Only dtype 0x08 (unsigned byte) is accepted, with 1 to 4
 * dimensions, none zero, and at most RK_IDX_MAX_BYTES of data; the data must fill the rest
 * of the file exactly. rk_idx_load also reads gzip-compressed files (detected by the 1f 8b
 * magic). Every function returns 0 or a negative RK_E* code and fills `err` (may be NULL)
 * with one line naming the file and the problem; on error the output struct is zeroed and
 * nothing needs freeing.
 */
#ifndef RK_NN_IDX_H
#define RK_NN_IDX_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"

#define RK_IDX_UBYTE 0x08
#define RK_IDX_MAX_DIMS 4
/* Largest data section we accept, so a bad header cannot make us allocate huge memory. */
#define RK_IDX_MAX_BYTES ((size_t)1 << 30)

typedef struct rk_idx {
    int dtype;                      /* 0x08 ubyte only is accepted */
    int ndim;                       /* 1..RK_IDX_MAX_DIMS */
    uint32_t dims[RK_IDX_MAX_DIMS]; /* dims[ndim..] are 0 */
    size_t nbytes;                  /* product of dims (one byte per element) */
    uint8_t *data;                  /* nbytes, owned; free with rk_idx_free */
} rk_idx;

/* Parse raw (uncompressed) IDX bytes in memory; `name` (may be NULL) is used in messages.
 * The data is copied, so `buf` may be freed afterwards. */
int rk_idx_parse(const uint8_t *buf, size_t len, const char *name, rk_idx *out, rk_err *err);

/* Read an IDX file, raw or gzip-compressed. RK_ENOENT if it does not exist, RK_EIO if it
 * cannot be read, RK_EFORMAT if it (or its gzip stream) is malformed, RK_ENOMEM. */
int rk_idx_load(const char *path, rk_idx *out, rk_err *err);

/* Free the data and zero the struct. Safe on a zeroed struct and on NULL. */
void rk_idx_free(rk_idx *idx);

/* rk_idx_load through a cache of decoded files in `cache_dir` (NULL or "": no cache), so that
 * a relaunched job does not inflate and check its dataset again (docs/recovery.md, "The
 * dataset of a relaunch"): the job's snapshot directory's cache (rk_snap_cache_dir), memory
 * the node holds for the job. An entry is a safetensors file `idx-<16 hex>.safetensors` (the
 * XXH64 of its key) holding the decoded data as one U8 tensor "data" and, in its metadata,
 * the key (the source's path, device, inode, size and modification time), the data's XXH64
 * and the IDX dtype and dimensions. An entry is used only when all of these match and the
 * hash verifies; anything else (absent, another key, torn, a link, not a regular file) is a
 * miss: the source is read and checked as rk_idx_load does, and the entry written (atomic,
 * best effort: a failure to write leaves the next launch to read the source). *hit: 1 read
 * from the cache, -1 a miss that wrote the entry, 0 a miss without one (may be NULL). */
#define RK_IDX_CACHE_PREFIX "idx-"
int rk_idx_load_cached(const char *path, const char *cache_dir, rk_idx *out, int *hit, rk_err *err);

/* Fashion-MNIST normalisation: image bytes become (x/255 - MEAN) / STD. */
#define RK_FMNIST_MEAN 0.2860f
#define RK_FMNIST_STD 0.3530f
#define RK_FMNIST_ROWS 28
#define RK_FMNIST_COLS 28
#define RK_FMNIST_CLASSES 10
#define RK_FMNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

/* The images stay as the file's bytes (a quarter of the memory of floats, and nothing to
 * convert at load); lut[] maps a byte to its normalised float, and rk_dataset_images or a
 * lookup per pixel gives the model's input. */
typedef struct rk_dataset {
    int n;           /* number of examples */
    int rows, cols;  /* 28, 28 */
    uint8_t *pixels; /* n*rows*cols raw bytes, row-major */
    uint8_t *labels; /* n values in 0..9 */
    float lut[256];  /* lut[v] = ((float)v / 255 - RK_FMNIST_MEAN) / RK_FMNIST_STD */
} rk_dataset;

/* Load the train (train != 0: train-images-idx3-ubyte, train-labels-idx1-ubyte) or test
 * (t10k-...) split from `dir`. Each file may be gzipped (name + ".gz", preferred) or raw.
 * Images must be n x 28 x 28, labels n values below 10. RK_ENOENT names the paths tried. */
int rk_dataset_load_fmnist(const char *dir, int train, rk_dataset *out, rk_err *err);

/* rk_dataset_load_fmnist with each file read through rk_idx_load_cached's cache in
 * `cache_dir` (NULL: none). */
int rk_dataset_load_fmnist_cached(const char *dir, int train, const char *cache_dir,
                                  rk_dataset *out, rk_err *err);

/* Write the normalised pixels of images first .. first+count-1 to out (count*rows*cols
 * floats, row-major), through ds->lut. The caller keeps 0 <= first, 0 <= count and
 * first + count <= ds->n. */
void rk_dataset_images(const rk_dataset *ds, int first, int count, float *out);

/* Free pixels and labels and zero the struct. Safe on a zeroed struct and on NULL. */
void rk_dataset_free(rk_dataset *ds);

#endif
