/*
 * Inside librekindle: little-endian loads and stores, the byte order of every file format
 * rekindle writes (safetensors' header length and tensors, checkpoint fields). Byte by byte,
 * so alignment and the host's order never matter; compilers turn each into one move.
 */
#ifndef RK_BASE_BYTES_H
#define RK_BASE_BYTES_H

#include <stdint.h>

static inline uint16_t rk_le16_load(const void *p)
{
    const uint8_t *b = p;
    return (uint16_t)(b[0] | (uint16_t)b[1] << 8);
}

static inline uint32_t rk_le32_load(const void *p)
{
    const uint8_t *b = p;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static inline uint64_t rk_le64_load(const void *p)
{
    const uint8_t *b = p;
    return (uint64_t)rk_le32_load(b) | (uint64_t)rk_le32_load(b + 4) << 32;
}

static inline void rk_le16_store(void *p, uint16_t v)
{
    uint8_t *b = p;
    b[0] = (uint8_t)v;
    b[1] = (uint8_t)(v >> 8);
}

static inline void rk_le32_store(void *p, uint32_t v)
{
    uint8_t *b = p;
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

static inline void rk_le64_store(void *p, uint64_t v)
{
    uint8_t *b = p;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

#endif
