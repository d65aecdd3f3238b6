/*
 * The predictor's JSON files (predict/jsonfile.h): jansson behind the bounded file reader of
 * rekindle/fileio.h and the message sanitiser of base/msg.h.
 */
#include "predict/jsonfile.h"

#include <stdint.h>
#include <stdlib.h>

#include "base/msg.h"
#include "rekindle/fileio.h"

json_t *rk_pred_json_text(const char *text, size_t len, const char *name, int *rc, rk_err *err)
{
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    if (!j) {
        char tb[JSON_ERROR_TEXT_LENGTH];
        *rc = rk_err_set(err, RK_EFORMAT, "%s: line %d: %s", name, je.line,
                         rk_msg_parser_text(tb, sizeof tb, je.text));
    }
    return j;
}

json_t *rk_pred_json_file(const char *path, const char *missing, int *rc, rk_err *err)
{
    uint8_t *buf;
    size_t len;
    int r = rk_file_read_all(path, &buf, &len, RK_PRED_JSON_FILE_MAX, err);
    if (r == RK_ENOENT) {
        *rc = rk_err_set(err, RK_ENOENT, "%s: no such file (%s)", path, missing);
        return NULL;
    }
    if (r < 0) {
        *rc = r;
        return NULL;
    }
    json_t *j = rk_pred_json_text((const char *)buf, len, path, rc, err);
    free(buf);
    return j;
}
