/*
 * libFuzzer target for what rekindle reads from Slurm (cluster/slurm.h): the input, as a
 * NUL-terminated copy, goes to the `scontrol show node` reader (into small and large
 * buffers) and to the `scontrol show hostnames` reader. A node's reason and address must be
 * NUL-terminated within their buffers; a host list accepted must hold only names that
 * rk_slurm_node_name_ok accepts, at most `max`; a refusal must carry a one-line printable
 * message.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/slurm.h"

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

static char g_names[16][RK_SLURM_NODE_MAX];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    bool drained, down;
    char reason[8], addr[4], big_reason[512], big_addr[128];
    if (rk_slurm_parse_node(text, &drained, &down, reason, sizeof reason, addr, sizeof addr) == 0) {
        check(memchr(reason, 0, sizeof reason) != NULL && memchr(addr, 0, sizeof addr) != NULL);
        check(!down || strstr(text, "State=") != NULL);
    }
    rk_slurm_parse_node(text, &drained, &down, big_reason, sizeof big_reason, big_addr,
                        sizeof big_addr);
    rk_slurm_parse_node(text, &drained, &down, NULL, 0, NULL, 0);
    rk_err err = {0};
    int n = rk_slurm_parse_hostnames(text, g_names, 16, &err);
    if (n >= 0) {
        check(n <= 16);
        for (int i = 0; i < n; i++)
            check(rk_slurm_node_name_ok(g_names[i]));
    } else {
        check(err.msg[0] != 0);
        for (const char *p = err.msg; *p; p++)
            check((unsigned char)*p >= 0x20 && (unsigned char)*p < 0x7f);
    }
    free(text);
    return 0;
}
