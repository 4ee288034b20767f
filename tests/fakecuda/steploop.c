/* fakecuda-steploop: a stand-in training loop with irregular steps, for the step finder's real
 * uprobe tests. It links the stand-in libcudart.so.13 and runs --steps steps. Each step's
 * length is drawn once (lognormal, p90/p10 of --spread around --step-us) and split into
 * --syncs phases of unequal length; a phase launches 10 kernels, sleeps its share of the step
 * (the GPU computing while the CPU is blocked, as on a data loader or a CPU collective), then
 * synchronizes (a short spin inside cudaStreamSynchronize, different per phase). Each step's
 * duration, from one step's last synchronize return to the next, goes to --log (ns per line),
 * which is what the agent must find.
 *
 *   fakecuda-steploop --steps N --step-us U [--spread S] [--syncs 1|2|3] [--seed X]
 *                     --log FILE [--wait-stdin] */
#include <math.h>
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

static void sleep_ns(long long ns) {
    if (ns <= 0) return;
    struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
    long steps = 0, seed = 1;
    int syncs = 1, wait_stdin = 0;
    double step_us = 0, spread = 1.0;
    const char *log_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atol(argv[++i]);
        else if (!strcmp(argv[i], "--step-us") && i + 1 < argc) step_us = atof(argv[++i]);
        else if (!strcmp(argv[i], "--spread") && i + 1 < argc) spread = atof(argv[++i]);
        else if (!strcmp(argv[i], "--syncs") && i + 1 < argc) syncs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = atol(argv[++i]);
        else if (!strcmp(argv[i], "--log") && i + 1 < argc) log_path = argv[++i];
        else if (!strcmp(argv[i], "--wait-stdin")) wait_stdin = 1;
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
        for (int j = 0; j < syncs; j++) {
            for (int k = 0; k < 10; k++) cudaLaunchKernel((const void *)main, g, b, NULL, 0, NULL);
            sleep_ns((long long)(f * step_us * 1e3 * SHARE[syncs - 1][j]));
            fakecudart_set_sync_ns((long long)(f * SYNC_US[j] * 1e3));
            cudaStreamSynchronize(NULL);
        }
        long long now = fakecuda_now_ns();
        if (last >= 0) fprintf(out, "%lld\n", now - last);
        last = now;
    }
    fclose(out);
    printf("done %ld\n", steps);
    fflush(stdout);
    return 0;
}
