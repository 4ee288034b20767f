/* A stand-in for a read from slow storage, for tests/gpu/jitter_loop.py: the calling thread
 * blocks uninterruptibly (state D, as a disk read does) for the given time. It vforks a child that
 * sleeps that long and exits; the kernel keeps a vfork's parent in D until then. The agent tells
 * a rank's own reads from a wait for its peers by that state, so the harness's in-process loader
 * (num_workers=0) must block as a real one on a slow disk does, not sleep (S). */
#define _GNU_SOURCE
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int ht_block_d_ns(long long ns) {
    if (ns <= 0) return 0;
    struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
    pid_t p = vfork();
    if (p == 0) {                       /* a vfork child: raw syscalls only */
        syscall(SYS_nanosleep, &ts, NULL);
        _exit(0);
    }
    if (p < 0) return -1;
    return waitpid(p, NULL, 0) == p ? 0 : -1;
}
