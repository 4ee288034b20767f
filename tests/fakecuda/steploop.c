/* fakecuda-steploop: a stand-in training loop with irregular steps, for the step finder's real
 * uprobe tests. It links the stand-in libcudart.so.13 and runs --steps steps. Each step's
 * length is drawn once (lognormal, p90/p10 of --spread around --step-us) and split into
 * --syncs phases of unequal length; a phase launches 10 kernels, sleeps its share of the step
 * (the GPU computing while the CPU is blocked, as on a data loader or a CPU collective), then
 * synchronizes (a short spin inside cudaStreamSynchronize, different per phase). Each step may
 * first wait for its input: --child-wait-us asks a child process (forked after the CUDA
 * libraries are mapped, as a DataLoader's workers are) through a pipe and blocks until it
 * answers, which it does after that long; --peer-port asks a TCP peer on 127.0.0.1 the same
 * way (the peer decides how long it takes). Each step's duration, from one step's last
 * synchronize return to the next, and the time it was blocked waiting for its input go to --log
 * ("<step ns> <blocked ns>" per line): what the agent must find. Blocked is the wait's wall time
 * less what the thread spent on a CPU or waiting for one meanwhile (its schedstat), so a loaded
 * machine's wake-up latency is not counted as waiting for the input.
 *
 *   fakecuda-steploop --steps N --step-us U [--spread S] [--syncs 1|2|3] [--seed X]
 *                     [--child-wait-us W | --peer-port P] [--spin] --log FILE [--wait-stdin]
 * --spin: the phases' share of the step is a busy loop instead of a sleep (no idle time in a
 * step but its input wait). --io-wait-us W: each step first blocks uninterruptibly for W, as a
 * read from slow storage does (state D): the loop vforks a child that sleeps W and exits, and
 * the kernel keeps a vfork's parent in D until then. */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "fakecuda_common.h"

typedef struct dim3 { unsigned int x, y, z; } dim3;
typedef struct CUstream_st *cudaStream_t;
extern int cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                            size_t sharedMem, cudaStream_t stream);
extern int cudaStreamSynchronize(cudaStream_t stream);
extern void fakecudart_set_sync_ns(long long ns);

static const double SHARE[3][3] = {{1.0, 0, 0}, {0.35, 0.65, 0}, {0.25, 0.6, 0.15}};
static const double SYNC_US[3] = {400, 900, 60};      /* each phase's spin inside the sync */

static double gauss(void) {                            /* Box-Muller on drand48 */
    double u = drand48(), v = drand48();
    return sqrt(-2.0 * log(u > 1e-12 ? u : 1e-12)) * cos(2 * M_PI * v);
}

/* This thread's (time on a CPU, time waiting for one) so far, ns (/proc/thread-self/schedstat);
 * zeros where the kernel has no schedstats. */
static void schedstat(long long *run, long long *queued) {
    *run = *queued = 0;
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (!f) return;
    if (fscanf(f, "%lld %lld", run, queued) != 2) *run = *queued = 0;
    fclose(f);
}

static void sleep_ns(long long ns) {
    if (ns <= 0) return;
    struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
    long steps = 0, seed = 1;
    int syncs = 1, wait_stdin = 0, spin = 0;
    double step_us = 0, spread = 1.0;
    const char *log_path = NULL;
    double child_wait_us = 0, io_wait_us = 0;
    int peer_port = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atol(argv[++i]);
        else if (!strcmp(argv[i], "--step-us") && i + 1 < argc) step_us = atof(argv[++i]);
        else if (!strcmp(argv[i], "--spread") && i + 1 < argc) spread = atof(argv[++i]);
        else if (!strcmp(argv[i], "--syncs") && i + 1 < argc) syncs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = atol(argv[++i]);
        else if (!strcmp(argv[i], "--log") && i + 1 < argc) log_path = argv[++i];
        else if (!strcmp(argv[i], "--child-wait-us") && i + 1 < argc) child_wait_us = atof(argv[++i]);
        else if (!strcmp(argv[i], "--peer-port") && i + 1 < argc) peer_port = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--io-wait-us") && i + 1 < argc) io_wait_us = atof(argv[++i]);
        else if (!strcmp(argv[i], "--wait-stdin")) wait_stdin = 1;
        else if (!strcmp(argv[i], "--spin")) spin = 1;
        else { fprintf(stderr, "fakecuda-steploop: bad argument %s\n", argv[i]); return 2; }
    }
    if (steps <= 0 || step_us <= 0 || syncs < 1 || syncs > 3 || spread < 1 || !log_path) {
        fprintf(stderr, "usage: fakecuda-steploop --steps N --step-us U [--spread S] "
                        "[--syncs 1|2|3] [--seed X] --log FILE [--wait-stdin]\n");
        return 2;
    }
    FILE *out = fopen(log_path, "w");
    if (!out) { perror(log_path); return 2; }
    srand48(seed);
    int req[2] = {-1, -1}, resp[2] = {-1, -1}, peer = -1;
    pid_t child = -1;
    if (child_wait_us > 0) {                          /* the loader worker */
        if (pipe(req) || pipe(resp)) { perror("pipe"); return 2; }
        child = fork();
        if (child == 0) {
            char c;
            close(req[1]);
            close(resp[0]);
            while (read(req[0], &c, 1) == 1) {
                sleep_ns((long long)(child_wait_us * 1e3));
                if (write(resp[1], &c, 1) != 1) break;
            }
            _exit(0);
        }
        close(req[0]);
        close(resp[1]);
    }
    if (peer_port > 0) {                              /* the peer */
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(peer_port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        peer = socket(AF_INET, SOCK_STREAM, 0);
        if (peer < 0 || connect(peer, (struct sockaddr *)&a, sizeof a)) { perror("connect"); return 2; }
    }
    double sigma = log(spread) / 2.5631;               /* p90/p10 of a lognormal = e^(2.5631 s) */
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    if (wait_stdin) {
        char line[64];
        if (!fgets(line, sizeof line, stdin)) return 1;
    }
    dim3 g = {1, 1, 1}, b = {128, 1, 1};
    long long last = -1;
    for (long s = 0; s < steps; s++) {
        double f = exp(sigma * gauss());
        long long waited = 0;
        if (child > 0 || peer >= 0) {
            char c = 'x';
            int out_fd = child > 0 ? req[1] : peer, in_fd = child > 0 ? resp[0] : peer;
            long long run0, q0, run1, q1;
            schedstat(&run0, &q0);
            long long t0 = fakecuda_now_ns();
            if (write(out_fd, &c, 1) != 1 || read(in_fd, &c, 1) != 1) { perror("input"); return 2; }
            waited = fakecuda_now_ns() - t0;
            schedstat(&run1, &q1);
            waited -= (run1 - run0) + (q1 - q0);
        }
        if (io_wait_us > 0) {                         /* own storage: blocked in D */
            long long ns = (long long)(io_wait_us * 1e3), run0, q0, run1, q1;
            struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
            schedstat(&run0, &q0);
            long long t0 = fakecuda_now_ns();
            pid_t p = vfork();
            if (p == 0) {                             /* a vfork child: syscalls only */
                syscall(SYS_nanosleep, &ts, NULL);
                _exit(0);
            }
            if (p < 0) { perror("vfork"); return 2; }
            waitpid(p, NULL, 0);
            waited = fakecuda_now_ns() - t0;
            schedstat(&run1, &q1);
            waited -= (run1 - run0) + (q1 - q0);
        }
        for (int j = 0; j < syncs; j++) {
            for (int k = 0; k < 10; k++) cudaLaunchKernel((const void *)main, g, b, NULL, 0, NULL);
            long long share = (long long)(f * step_us * 1e3 * SHARE[syncs - 1][j]);
            if (spin) fakecuda_spin_ns(share); else sleep_ns(share);
            fakecudart_set_sync_ns((long long)(f * SYNC_US[j] * 1e3));
            cudaStreamSynchronize(NULL);
        }
        long long now = fakecuda_now_ns();
        if (last >= 0) fprintf(out, "%lld %lld\n", now - last, waited);
        last = now;
    }
    fclose(out);
    if (child > 0) {
        close(req[1]);
        waitpid(child, NULL, 0);
    }
    if (peer >= 0) close(peer);
    printf("done %ld\n", steps);
    fflush(stdout);
    return 0;
}
