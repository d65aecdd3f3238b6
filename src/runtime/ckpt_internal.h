/*
 * Inside the checkpoint store: what ckpt.c offers ckpt_writer.c and no one else.
 */
#ifndef RK_RUNTIME_CKPT_INTERNAL_H
#define RK_RUNTIME_CKPT_INTERNAL_H

#include <stdbool.h>

#include "rekindle/ckpt.h"

/* rk_ckpt_save, choosing whether the checksums are computed by a second thread beside the
 * writing one (true: a synchronous save, the caller waits) or by the writing thread itself
 * (false: the background writer, already off the training thread, which must not take a
 * second core from training). */
int rk_ckpt_save_in(const char *dir, const rk_ckpt_meta *meta, const rk_ckpt_item *items, size_t n,
                    int keep, bool hash_beside, rk_err *err);

#endif
