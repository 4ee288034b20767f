/* Busy-wait helper shared by the stand-in CUDA libraries. A busy wait (not sleep) gives a
 * latency that is accurate to a microsecond or so and does not depend on scheduler wake-ups,
 * which is what the latency assertions in the tests need. */
#ifndef FAKECUDA_COMMON_H
#define FAKECUDA_COMMON_H
#include <stdlib.h>
#include <time.h>

static inline long long fakecuda_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void fakecuda_spin_ns(long long ns) {
    if (ns <= 0) return;
    long long end = fakecuda_now_ns() + ns;
    while (fakecuda_now_ns() < end) { __asm__ volatile("" ::: "memory"); }
}

/* Latency in ns from an environment variable, read once; -1 in *cache means "not read yet". */
static inline long long fakecuda_env_ns(const char *name, long long *cache) {
    if (*cache < 0) {
        const char *v = getenv(name);
        *cache = v ? atoll(v) : 0;
    }
    return *cache;
}
#endif
