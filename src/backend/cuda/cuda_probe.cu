/* CUDA backend entry points (sm_90a). The op kernels arrive with the CUDA issues; this file keeps
 * the toolchain path (nvcc, extern "C" linkage, device query) compiled in CI from day one. */
#include <cuda_runtime.h>

extern "C" int di_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}
