/* xoshiro256** (Blackman & Vigna) with splitmix64 seeding; see rekindle/rng.h. Pure C, no
 * global state, so the same seed gives the same bits everywhere. */
#include "rekindle/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void rk_rng_seed(rk_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

void rk_rng_derive(rk_rng *r, uint64_t seed, uint64_t a, uint64_t b)
{
    uint64_t x = seed;
    uint64_t h = splitmix64(&x);
    x = h ^ (a * 0xd6e8feb86659fd93ULL);
    h = splitmix64(&x);
    x = h ^ (b * 0xa0761d6478bd642fULL);
    rk_rng_seed(r, splitmix64(&x));
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t rk_rng_next(rk_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float rk_rng_uniform(rk_rng *r)
{
    return (float)(rk_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

uint64_t rk_rng_below(rk_rng *r, uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t v;
    do {
        v = rk_rng_next(r);
    } while (v >= limit);
    return v % n;
}

float rk_rng_normal(rk_rng *r)
{
    double u1 = ((double)(rk_rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (double)(rk_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void rk_rng_permutation(rk_rng *r, uint32_t *idx, size_t n)
{
    for (size_t i = 0; i < n; i++)
        idx[i] = (uint32_t)i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)rk_rng_below(r, i);
        uint32_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}
