/* Stand-in for the CUDA driver library (libcuda.so.1). It exports the real symbol names and
 * signatures the agent probes, each busy-waiting for a controlled latency:
 *   FAKECUDA_DRV_LAUNCH_NS  cuLaunchKernel / cuLaunchKernelEx / cuGraphLaunch
 *                           (or fakecuda_set_launch_ns)
 *   FAKECUDA_DRV_SYNC_NS    cuStreamSynchronize                 (or fakecuda_set_sync_ns)
 * plus fakecuda_null(), an empty function for probe-cost calibration. */
#include <stddef.h>
#include "fakecuda_common.h"

typedef int CUresult;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUlaunchAttribute_st { int id; char pad[60]; } CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

static long long launch_ns = -1, sync_ns = -1;

void fakecuda_set_launch_ns(long long ns) { launch_ns = ns; }
void fakecuda_set_sync_ns(long long ns) { sync_ns = ns; }

__attribute__((noinline)) void fakecuda_null(void) { __asm__ volatile("" ::: "memory"); }

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra) {
    (void)f; (void)gridDimX; (void)gridDimY; (void)gridDimZ; (void)blockDimX; (void)blockDimY;
    (void)blockDimZ; (void)sharedMemBytes; (void)hStream; (void)kernelParams; (void)extra;
    fakecuda_spin_ns(fakecuda_env_ns("FAKECUDA_DRV_LAUNCH_NS", &launch_ns));
    return 0;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra) {
    (void)config; (void)f; (void)kernelParams; (void)extra;
    fakecuda_spin_ns(fakecuda_env_ns("FAKECUDA_DRV_LAUNCH_NS", &launch_ns));
    return 0;
}

CUresult cuStreamSynchronize(CUstream hStream) {
    (void)hStream;
    fakecuda_spin_ns(fakecuda_env_ns("FAKECUDA_DRV_SYNC_NS", &sync_ns));
    return 0;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    (void)hGraphExec; (void)hStream;
    fakecuda_spin_ns(fakecuda_env_ns("FAKECUDA_DRV_LAUNCH_NS", &launch_ns));
    return 0;
}
