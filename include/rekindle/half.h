/*
 * The 16-bit floating-point formats: fp16 (IEEE binary16) and bf16 (the top half of an fp32),
 * for mixed precision (rekindle/amp.h) and the compressed collectives. docs/amp.md has the
 * formats and the rounding.
 *
 * fp32 <-> fp16 / bf16 conversions. Integer arithmetic (no _Float16, no F16C needed), the same bits
 * on every machine (in the default floating-point environment: round to nearest):
 * - fp32 -> fp16 / bf16 round to nearest, ties to even. fp16 results below 2^-14 are
 *   subnormals (down to 2^-24; 2^-25 itself ties to 0); fp16 overflows to +-inf from 65520
 *   (the midpoint between 65504, the largest fp16, and 2^16) up; bf16 from the midpoint
 *   between its largest value and 2^128. -0 stays -0 and inf stays inf.
 * - A NaN stays a NaN of the same sign in every direction, made quiet (the top mantissa bit
 *   set), keeping the top payload bits that fit; a NaN never becomes inf (an fp32 NaN whose
 *   payload is all in the bits fp16 or bf16 drops is kept a NaN by the quiet bit).
 * - fp16 / bf16 -> fp32 is exact (every value is representable); NaNs are quieted.
 * The _n forms convert n elements, src and dst must not overlap; they give the same bits as
 * the scalar forms. They are loops the compiler vectorises; on x86-64 CPUs with F16C the fp16
 * ones use the hardware instructions instead (same bits, several times faster), unless
 * rk_half_use_f16c(0) said not to.
 */
#ifndef REKINDLE_HALF_H
#define REKINDLE_HALF_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/export.h"

#ifdef __cplusplus
extern "C" {
#endif

RK_API uint16_t rk_f32_to_f16(float x);
RK_API float rk_f16_to_f32(uint16_t h);
RK_API uint16_t rk_f32_to_bf16(float x);
RK_API float rk_bf16_to_f32(uint16_t h);

RK_API void rk_f32_to_f16_n(const float *src, uint16_t *dst, size_t n);
RK_API void rk_f16_to_f32_n(const uint16_t *src, float *dst, size_t n);
RK_API void rk_f32_to_bf16_n(const float *src, uint16_t *dst, size_t n);
RK_API void rk_bf16_to_f32_n(const uint16_t *src, float *dst, size_t n);

/* on = 1: the fp16 _n forms use F16C when the CPU has it (the default); 0: always the
 * portable loops (for tests and benchmarks). Returns 1 if F16C is used from now on. Set it
 * before converting, not while other threads convert. */
RK_API int rk_half_use_f16c(int on);

#ifdef __cplusplus
}
#endif
#endif
