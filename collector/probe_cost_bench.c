/* Probe-cost calibration helper for collector/probe_cost.py.
 *
 * hypertrace_null() does nothing; main() calls it N times (N = argv[1]) through a volatile
 * pointer, so the call cannot be inlined or removed, and prints the elapsed nanoseconds. Timed
 * once without and once with entry+return uprobes on hypertrace_null, the difference per call is
 * what one probed call costs the process: the trap, the BPF program and the return trampoline.
 * It runs as a separate process so the agent's own-pid exclusion does not shortcut the program. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline, used)) void hypertrace_null(void) { __asm__ volatile("" ::: "memory"); }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000;
    void (*volatile fn)(void) = hypertrace_null;
    struct timespec a, b;
    for (long i = 0; i < 1000; i++) fn();     /* warm up: page in, settle the branch predictors */
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) fn();
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%lld\n", (long long)(b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec));
    return 0;
}
