/* Which shared object a code address belongs to, for librkloopback.so (loopback.c). */
#ifndef RK_PRELOAD_CALLER_H
#define RK_PRELOAD_CALLER_H

/* 1 if `addr` lies in Open MPI's code: a shared object under an "openmpi" directory, or named
 * libmpi*, libopen-*, libpmix*, mca_*. */
int rk_caller_is_openmpi(const void *addr);

#endif
