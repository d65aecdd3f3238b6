/*
 * The predictor's JSON files (the dataset manifest, the detectors file): parsed from text or
 * read through the one bounded opener, with errors that name the file and the parser's line
 * (never the bytes it stopped at). Private to src/predict.
 */
#ifndef RK_PREDICT_JSONFILE_H
#define RK_PREDICT_JSONFILE_H

#include <jansson.h>
#include <stddef.h>

#include "rekindle/error.h"

/* Largest JSON file read (the manifest, MODEL.json): far above what rekindle writes. */
#define RK_PRED_JSON_FILE_MAX ((size_t)64 << 20)

/* Parse the JSON file at path (regular file, at most RK_PRED_JSON_FILE_MAX bytes, no blocking
 * on a FIFO): NULL with *rc RK_ENOENT (naming the file and `missing`, what writes it) when it
 * does not exist, RK_EFORMAT with the parser's line and message when it is not JSON, the
 * opener's error otherwise. */
json_t *rk_pred_json_file(const char *path, const char *missing, int *rc, rk_err *err);
/* The same from len bytes of text (`name` for errors). */
json_t *rk_pred_json_text(const char *text, size_t len, const char *name, int *rc, rk_err *err);

#endif
