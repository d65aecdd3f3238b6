/*
 * Inside rekindle: the GPU kernels of gpu/kernels.cu as PTX text embedded in the binary at build
 * time (src/gpu/embed_ptx.cmake), one module per target: sm_61 (Pascal and everything up to
 * Turing, JIT-compiled by the driver) and sm_80 (Ampere and newer). A build made without clang
 * has none: rk_gpu_kernels_built is 0 and the arrays are empty (rk burn says "built without
 * GPU kernels"). Not public API.
 */
#ifndef RK_GPU_KERNELS_H
#define RK_GPU_KERNELS_H

extern const int rk_gpu_kernels_built; /* 1 when the PTX below was compiled in */
extern const char rk_gpu_ptx_sm61[];   /* NUL-terminated PTX text ("" when not built) */
extern const char rk_gpu_ptx_sm80[];

/* The PTX for a device of compute capability major.minor: sm_80's from 8.0 on, sm_61's from
 * 6.1 to 7.x; NULL below 6.1 (older than Pascal's GP10x) or when the kernels were not built. */
static inline const char *rk_gpu_ptx_for(int cc_major, int cc_minor)
{
    if (!rk_gpu_kernels_built)
        return 0;
    if (cc_major >= 8)
        return rk_gpu_ptx_sm80;
    if (cc_major > 6 || (cc_major == 6 && cc_minor >= 1))
        return rk_gpu_ptx_sm61;
    return 0;
}

#endif
