/*
 * libFuzzer target for a fleet dataset's manifest (rk_fleet_parse_manifest, the parser behind
 * rk_fleet_load): any input is rejected with an error or gives GPUs whose fields keep the
 * invariants the evaluation relies on.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "predict/fleetdata.h"
#include "predict/windows.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rk_fleet f;
    rk_err err = {0};
    if (rk_fleet_parse_manifest(&f, (const char *)data, size, "fuzz", &err) != RK_OK) {
        if (!err.msg[0])
            abort(); /* every rejection names its problem */
        return 0;
    }
    for (int i = 0; i < f.gpus; i++) {
        const rk_fleet_gpu *g = &f.gpu[i];
        if (g->split < RK_FLEET_TRAIN || g->split > RK_FLEET_TEST || g->index != i ||
            g->failure > (long)g->steps || g->precursor > g->failure || !g->file[0] ||
            strchr(g->file, '/') || g->x || g->score)
            abort();
        (void)rk_fleet_watch_end(g);
        (void)rk_fleet_label(g, g->steps ? g->steps - 1 : 0, 60);
    }
    rk_fleet_free(&f);
    return 0;
}
