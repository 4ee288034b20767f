/* The hypertrace step marker: libhypertrace_step-<hash>.so, built and loaded by
 * hypertrace/collector/marker.py.
 *
 * A training loop calls hypertrace_step() once per step. The function does nothing; what makes
 * it a marker is that the agent finds this library in /proc/PID/maps by its file name and puts an
 * entry uprobe on the symbol, so each call is one step boundary with an exact timestamp. Without
 * an agent attached it costs one call and a return.
 *
 * On x86-64 the body is written out as a frame-pointer prologue (push rbp; mov rbp,rsp) rather
 * than the bare `ret` the compiler makes of an empty function: the kernel emulates a probed
 * `push` in the trap handler, while a probed `ret` is single-stepped out of line, a second trap
 * per call. It also keeps the first instruction free of the endbr64 that -fcf-protection
 * toolchains would otherwise put there. Other architectures get the plain C function. */

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl hypertrace_step\n"
        ".type hypertrace_step, @function\n"
        ".p2align 4\n"
        "hypertrace_step:\n"
        "    push %rbp\n"
        "    mov %rsp, %rbp\n"
        "    pop %rbp\n"
        "    ret\n"
        ".size hypertrace_step, .-hypertrace_step\n");
#else
__attribute__((noinline, used, visibility("default"))) void hypertrace_step(void) {
    __asm__ __volatile__("" ::: "memory");      /* an empty body the optimizer may not drop */
}
#endif
