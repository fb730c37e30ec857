/* How the CPU kernels split their work over threads (shared by the kernel sources).
 *
 * run_threads(fn, args, stride, nt) calls fn(args + t·stride) for t < nt, at once on nt threads.
 * Built with OpenMP (the default), the threads are the OpenMP runtime's. Once torch is loaded
 * that runtime is torch's own libgomp (one shared object per soname), so a kernel runs on the
 * threads torch's operations just ran on. Threads of the kernel's own competed with those
 * threads, which spin for a while after each of torch's parallel regions
 * (benchmarks/cpu_kernel_passes.py times a core product right after a torch.bmm on both builds).
 * Without OpenMP, pthreads (a thread that cannot be started runs its share in the caller).
 */
#ifndef OSA_LAB_THREADS_H
#define OSA_LAB_THREADS_H

#include <pthread.h>
#include <stddef.h>

#define OSA_MAX_THREADS 256

static inline int clamp_threads(int requested, int units)
{
    int nt = requested < 1 ? 1 : requested > OSA_MAX_THREADS ? OSA_MAX_THREADS : requested;
    return nt > units ? (units > 0 ? units : 1) : nt;
}

static inline void run_threads(void *(*fn)(void *), void *args, size_t stride, int nt)
{
    char *base = args;
    if (nt <= 1) {
        fn(base);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(static, 1)
    for (int t = 0; t < nt; ++t) fn(base + (size_t)t * stride);
#else
    pthread_t threads[OSA_MAX_THREADS];
    int started[OSA_MAX_THREADS] = {0};
    for (int t = 1; t < nt; ++t) started[t] = pthread_create(&threads[t], NULL, fn, base + (size_t)t * stride) == 0;
    fn(base);
    for (int t = 1; t < nt; ++t) {
        if (started[t]) pthread_join(threads[t], NULL);
        else fn(base + (size_t)t * stride);
    }
#endif
}

#endif
