/* Probe-cost calibration helper for collector/probe_cost.py.
 *
 *   probe-cost-bench N R
 *
 * Prints "ready PID", waits for a line on stdin, times R loops of N calls of hypertrace_null()
 * (one line each: the loop's CPU time in ns), prints "probe", waits for another line (the
 * caller attaches its probes to this process meanwhile), and times R more loops. The calls go
 * through a volatile pointer, so they cannot be inlined or removed. The per-call difference
 * between the two halves is what one probed call costs the process: the trap, the BPF program
 * and the return trampoline. It runs as a separate process so the agent's own-pid exclusion does
 * not shortcut the program, and the caller probes this pid only, so another agent calibrating
 * on the same host at the same moment does not add its probes to ours.
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
#include <unistd.h>

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

static void wait_line(void) {
    char line[64];
    if (!fgets(line, sizeof line, stdin)) exit(1);
}

static void timed_loops(void (*volatile fn)(void), long n, int r) {
    for (int k = 0; k < r; k++) {
        long long a = thread_cpu_ns();
        for (long i = 0; i < n; i++) fn();
        long long b = thread_cpu_ns();
        printf("%lld\n", b - a);
    }
    fflush(stdout);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000;
    int r = argc > 2 ? atoi(argv[2]) : 5;
    void (*volatile fn)(void) = hypertrace_null;
    for (long i = 0; i < 1000; i++) fn();     /* warm up: page in, settle the branch predictors */
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    wait_line();
    timed_loops(fn, n, r);
    printf("probe\n");
    fflush(stdout);
    wait_line();
    timed_loops(fn, n, r);
    return 0;
}
