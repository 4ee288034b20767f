/* Probe-cost calibration helper for collector/probe_cost.py.
 *
 * main() calls hypertrace_null() N times (N = argv[1]) through a volatile pointer, so the call
 * cannot be inlined or removed, and prints the CPU time the loop took, in nanoseconds. Timed
 * once without and once with entry+return uprobes on hypertrace_null, the difference per call is
 * what one probed call costs the process: the trap, the BPF program and the return trampoline.
 * It runs as a separate process so the agent's own-pid exclusion does not shortcut the program.
 *
 * Why CPU time (CLOCK_THREAD_CPUTIME_ID): a probe's cost is CPU the traced thread spends in the
 * kernel on its behalf, and that time is charged to the thread. Wall time would also count every
 * moment another task held the CPU, which on a loaded node made the calibration read 10-100x too
 * high.
 *
 * Why a real prologue: the kernel handles a uprobe by emulating the probed instruction when it
 * can (push, mov, jmp, call, nop) and by single-stepping a copy of it out of line otherwise.
 * Real library entry points begin with `push %rbp` (or `endbr64; push`), which is emulated; a
 * bare `ret` is single-stepped and costs markedly more. So hypertrace_null opens like a real
 * library function: push %rbp; mov %rsp,%rbp; a little work; pop; ret. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__)
/* Written in assembly so the compiler cannot reorder the prologue (or add endbr64 before it). */
__asm__(".text\n"
        ".globl hypertrace_null\n"
        ".type hypertrace_null, @function\n"
        "hypertrace_null:\n"
        "    push %rbp\n"
        "    mov  %rsp, %rbp\n"
        "    mov  %rdi, %rax\n"
        "    add  $1, %rax\n"
        "    imul $3, %rax, %rax\n"
        "    pop  %rbp\n"
        "    ret\n"
        ".size hypertrace_null, .-hypertrace_null\n");
void hypertrace_null(void);
#else
/* Elsewhere the frame-pointer prologue comes from the compiler (stp x29, x30 on arm64). */
__attribute__((noinline, used, optimize("no-omit-frame-pointer")))
void hypertrace_null(void) {
    static volatile long sink;
    sink = sink * 3 + 1;
}
#endif

static long long thread_cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000;
    void (*volatile fn)(void) = hypertrace_null;
    for (long i = 0; i < 1000; i++) fn();     /* warm up: page in, settle the branch predictors */
    long long a = thread_cpu_ns();
    for (long i = 0; i < n; i++) fn();
    long long b = thread_cpu_ns();
    printf("%lld\n", b - a);
    return 0;
}
