/* fakecuda-worker: a stand-in training process. It links the stand-in libcudart.so.13 (which
 * pulls in libcuda.so.1) and calls the probed APIs in a loop, paced to --rate calls per second
 * by absolute deadlines (so the rate holds even when a call is slow), until --calls calls were
 * made or --duration seconds passed, or SIGTERM.
 *
 *   fakecuda-worker [--api launch|launch-ex|driver|sync|devsync|step|graph|none] [--rate HZ]
 *                   [--calls N] [--duration S] [--marker LIB] [--wait-stdin]
 *
 * It prints "ready PID" once the libraries are mapped; with --wait-stdin it then waits for a
 * line on stdin before the first call (so a test can attach probes first and count exactly).
 * At the end it prints "done CALLS". "step" = 8 x cudaLaunchKernel + 1 x cudaStreamSynchronize
 * per iteration, like a training step; "graph" = 1 x cudaGraphLaunch + 1 x cudaStreamSynchronize
 * (a CUDA-graph training step); "none" calls nothing (with --marker: only the marker).
 * --marker LIB loads a step-marker library (dlopen) and calls its hypertrace_step() at the start
 * of every iteration, as a training loop calling hypertrace.collector.marker.step() would.
 * Without --rate the loop runs flat out (CPU-bound). Latencies come from the FAKECUDA_*
 * variables (see the library sources). */
#include <dlfcn.h>
#include <signal.h>
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
extern int cudaLaunchKernelExC(const void *config, const void *func, void **args);
extern int cudaStreamSynchronize(cudaStream_t stream);
extern int cudaDeviceSynchronize(void);
typedef struct CUgraphExec_st *cudaGraphExec_t;
extern int cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream);
extern int cuLaunchKernel(void *f, unsigned int, unsigned int, unsigned int, unsigned int,
                          unsigned int, unsigned int, unsigned int, cudaStream_t, void **, void **);

static volatile sig_atomic_t stop = 0;
static void on_term(int sig) { (void)sig; stop = 1; }

static void usage(void) {
    fprintf(stderr, "usage: fakecuda-worker [--api launch|launch-ex|driver|sync|devsync|step|"
                    "graph|none] [--rate HZ] [--calls N] [--duration S] [--marker LIB] "
                    "[--wait-stdin]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *api = "launch";
    double rate = 0, duration = 1e9;
    long long max_calls = -1;
    int wait_stdin = 0;
    const char *marker_lib = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--api") && i + 1 < argc) api = argv[++i];
        else if (!strcmp(argv[i], "--rate") && i + 1 < argc) rate = atof(argv[++i]);
        else if (!strcmp(argv[i], "--calls") && i + 1 < argc) max_calls = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--duration") && i + 1 < argc) duration = atof(argv[++i]);
        else if (!strcmp(argv[i], "--marker") && i + 1 < argc) marker_lib = argv[++i];
        else if (!strcmp(argv[i], "--wait-stdin")) wait_stdin = 1;
        else usage();
    }
    int mode;
    if (!strcmp(api, "launch")) mode = 0;
    else if (!strcmp(api, "launch-ex")) mode = 1;
    else if (!strcmp(api, "driver")) mode = 2;
    else if (!strcmp(api, "sync")) mode = 3;
    else if (!strcmp(api, "devsync")) mode = 4;
    else if (!strcmp(api, "step")) mode = 5;
    else if (!strcmp(api, "graph")) mode = 6;
    else if (!strcmp(api, "none")) mode = 7;
    else usage();
    void (*marker)(void) = NULL;
    if (marker_lib) {
        void *h = dlopen(marker_lib, RTLD_NOW);
        if (h) *(void **)&marker = dlsym(h, "hypertrace_step");
        if (!marker) {
            fprintf(stderr, "fakecuda-worker: no hypertrace_step in %s: %s\n", marker_lib,
                    dlerror());
            return 2;
        }
    }

    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    if (wait_stdin) {
        char line[64];
        if (!fgets(line, sizeof line, stdin)) return 1;
    }
    dim3 g = {1, 1, 1}, b = {128, 1, 1};
    long long calls = 0;
    long long start = fakecuda_now_ns();
    long long end = start + (long long)(duration * 1e9);
    double period_ns = rate > 0 ? 1e9 / rate : 0;
    while (!stop && (max_calls < 0 || calls < max_calls)) {
        long long now = fakecuda_now_ns();
        if (now >= end) break;
        if (period_ns > 0) {
            long long due = start + (long long)(calls * period_ns);
            if (due > now) {
                long long wait = due - now;
                struct timespec ts = {wait / 1000000000LL, wait % 1000000000LL};
                nanosleep(&ts, NULL);
                continue;
            }
        }
        if (marker) marker();
        switch (mode) {
        case 0: cudaLaunchKernel((const void *)main, g, b, NULL, 0, NULL); break;
        case 1: cudaLaunchKernelExC(NULL, (const void *)main, NULL); break;
        case 2: cuLaunchKernel((void *)main, 1, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL); break;
        case 3: cudaStreamSynchronize(NULL); break;
        case 4: cudaDeviceSynchronize(); break;
        case 5:
            for (int k = 0; k < 8; k++) cudaLaunchKernel((const void *)main, g, b, NULL, 0, NULL);
            cudaStreamSynchronize(NULL);
            break;
        case 6:
            cudaGraphLaunch(NULL, NULL);
            cudaStreamSynchronize(NULL);
            break;
        case 7: break;
        }
        calls++;
    }
    printf("done %lld\n", calls);
    fflush(stdout);
    return 0;
}
