/*
 * Linked into every unit test of the ThreadSanitizer build (RK_TSAN, tests/CMakeLists.txt):
 * holds OpenBLAS to one thread before main runs, whatever the environment or the CPU count.
 * libopenblas is not instrumented: its pool's workers hand a product back to the caller
 * through their own atomics, which TSan cannot see, while the memset they zero the output
 * with is intercepted, so any product big enough to be shared read as a race between the
 * caller and a worker (rk_pred_forward against a worker's memset, in test_cmapss). On one
 * thread every product runs on the caller's thread; our own threads stay checked. Looked up
 * with dlsym, so a test that does not link OpenBLAS is left alone.
 */
#include <dlfcn.h>
#include <string.h>

__attribute__((constructor)) static void blas_one_thread(void)
{
    void *p = dlsym(RTLD_DEFAULT, "openblas_set_num_threads");
    void (*set)(int);
    _Static_assert(sizeof p == sizeof set, "dlsym results fit a function pointer");
    memcpy(&set, &p, sizeof p);
    if (set)
        set(1);
}
