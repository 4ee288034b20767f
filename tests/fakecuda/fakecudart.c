/* Stand-in for the CUDA runtime (libcudart.so.13) with the real exported names and signatures.
 * As in the real runtime, the launch, graph-launch and stream-synchronize calls go through the
 * driver (cuLaunchKernel, cuLaunchKernelEx, cuGraphLaunch, cuStreamSynchronize in libcuda.so.1)
 * inside, which is what the agent's nesting logic must count once. Latencies (busy-wait, ns), on
 * top of the driver's:
 *   FAKECUDA_RT_LAUNCH_NS   cudaLaunchKernel / cudaLaunchKernelExC / cudaGraphLaunch
 *                           (or fakecudart_set_launch_ns)
 *   FAKECUDA_RT_SYNC_NS     cudaStreamSynchronize / cudaEventSynchronize (or fakecudart_set_sync_ns)
 *   FAKECUDA_DEVSYNC_NS     cudaDeviceSynchronize, which calls nothing inside (a non-nested API) */
#include <stddef.h>
#include "fakecuda_common.h"

typedef int cudaError_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct dim3 { unsigned int x, y, z; } dim3;
typedef struct cudaLaunchAttribute_st { int id; char pad[60]; } cudaLaunchAttribute;
typedef struct cudaLaunchConfig_st {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned int numAttrs;
} cudaLaunchConfig_t;

/* The driver API this runtime calls (from libcuda.so.1). */
typedef struct CUlaunchConfig_st CUlaunchConfig;
extern int cuLaunchKernel(void *f, unsigned int, unsigned int, unsigned int, unsigned int,
                          unsigned int, unsigned int, unsigned int, cudaStream_t, void **, void **);
extern int cuLaunchKernelEx(const CUlaunchConfig *config, void *f, void **kernelParams, void **extra);
extern int cuStreamSynchronize(cudaStream_t hStream);
extern int cuGraphLaunch(cudaGraphExec_t hGraphExec, cudaStream_t hStream);

static long long launch_ns = -1, sync_ns = -1, devsync_ns = -1;

void fakecudart_set_launch_ns(long long ns) { launch_ns = ns; }
void fakecudart_set_sync_ns(long long ns) { sync_ns = ns; }
void fakecudart_set_devsync_ns(long long ns) { devsync_ns = ns; }

cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                             size_t sharedMem, cudaStream_t stream) {
    fakecuda_spin_ns(fakecuda_env_ns("FAKECUDA_RT_LAUNCH_NS", &launch_ns));
    return cuLaunchKernel((void *)func, gridDim.x, gridDim.y, gridDim.z, blockDim.x, blockDim.y,
                          blockDim.z, (unsigned int)sharedMem, stream, args, NULL);
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args) {
    fakecuda_spin_ns(fakecuda_env_ns("FAKECUDA_RT_LAUNCH_NS", &launch_ns));
    return cuLaunchKernelEx((const CUlaunchConfig *)0, (void *)func, args, NULL) + (config ? 0 : 0);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    fakecuda_spin_ns(fakecuda_env_ns("FAKECUDA_RT_SYNC_NS", &sync_ns));
    return cuStreamSynchronize(stream);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    (void)event;
    fakecuda_spin_ns(fakecuda_env_ns("FAKECUDA_RT_SYNC_NS", &sync_ns));
    return cuStreamSynchronize(NULL);
}

cudaError_t cudaDeviceSynchronize(void) {
    fakecuda_spin_ns(fakecuda_env_ns("FAKECUDA_DEVSYNC_NS", &devsync_ns));
    return 0;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
    fakecuda_spin_ns(fakecuda_env_ns("FAKECUDA_RT_LAUNCH_NS", &launch_ns));
    return cuGraphLaunch(graphExec, stream);
}
