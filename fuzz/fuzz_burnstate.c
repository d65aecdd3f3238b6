/*
 * libFuzzer target for the burn-in state file's parser (rk_burn_state_parse): arbitrary bytes
 * never crash. A rejected file is RK_EFORMAT (or RK_ENOMEM) with a one-line message naming
 * the file and no state. An accepted file's records each pass rk_burn_record_check, are in
 * strictly increasing key order, are found by their key, and, written out again and parsed
 * back (rk_burn_state_put's writer through a file in /tmp), give the same records.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "health/burnstate.h"

#define NAME "fuzz.json"

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rk_burn_state *s = (rk_burn_state *)1;
    rk_err err = {0};
    int rc = rk_burn_state_parse(NAME, (const char *)data, size, &s, &err);
    if (rc != RK_OK) {
        check(rc == RK_EFORMAT || rc == RK_ENOMEM);
        check(s == NULL);
        check(err.code == rc);
        check(strncmp(err.msg, NAME ": ", strlen(NAME) + 2) == 0);
        for (const char *p = err.msg; *p; p++)
            check((unsigned char)*p >= 0x20 && *p != 0x7f);
        return 0;
    }
    int n = rk_burn_state_count(s);
    check(n >= 0 && n <= RK_BURN_STATE_RECORDS_MAX);
    for (int i = 0; i < n; i++) {
        const rk_burn_record *r = rk_burn_state_at(s, i);
        check(r != NULL);
        check(rk_burn_record_check(r, NULL, &err) == RK_OK);
        if (i > 0)
            check(strcmp(rk_burn_state_at(s, i - 1)->key, r->key) < 0);
        check(rk_burn_state_find(s, r->key, NULL) == r);
        check(rk_burn_state_find(s, NULL, r->key) == r);
    }
    /* written again record by record, the file reads back the same */
    static char path[64];
    if (!path[0])
        snprintf(path, sizeof path, "/tmp/fuzz_burnstate.%ld.json", (long)getpid());
    unlink(path);
    for (int i = 0; i < n && i < 8; i++)
        check(rk_burn_state_put(path, rk_burn_state_at(s, i), &err) == RK_OK);
    rk_burn_state *back;
    check(rk_burn_state_load(path, &back, &err) == RK_OK);
    check(rk_burn_state_count(back) == (n < 8 ? n : 8));
    for (int i = 0; i < rk_burn_state_count(back); i++)
        check(memcmp(rk_burn_state_at(back, i), rk_burn_state_at(s, i), sizeof(rk_burn_record)) ==
              0);
    rk_burn_state_free(back);
    unlink(path);
    rk_burn_state_free(s);
    return 0;
}
