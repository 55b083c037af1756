// The CUDA runtime calls the cudnn frontend and its samples make, on host memory: what lets
// the samples run without a GPU against ferrodnn's libcudnn on its CPU handle (host pointers,
// FERRODNN_CUDNN_DEVICE=cpu). "Device" memory is host memory, copies are memcpy, streams and
// events do nothing, no stream capture ever starts, and the device reports itself as an sm_90 part. Kernel launches, CUDA
// libraries and NVRTC are refused (the frontend's own experimental engines need them; its
// cuDNN paths do not). Built by scripts/capi_frontend_samples.sh for its CPU mode only.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

extern "C" {

cudaError_t cudaMalloc(void** p, size_t n) {
    if (!p) return cudaErrorInvalidValue;
    *p = std::aligned_alloc(256, ((n + 255) / 256) * 256 + 256);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
    std::free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind) {
    if (n) std::memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t) { return cudaMemcpy(dst, src, n, kind); }
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
    if (n) std::memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int v, size_t n) {
    if (n) std::memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }
cudaError_t cudaGetDevice(int* d) {
    if (d) *d = 0;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
    if (!p) return cudaErrorInvalidValue;
    std::memset(p, 0, sizeof *p);
    std::strcpy(p->name, "ferrodnn host (no GPU)");
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->sharedMemPerBlock = 48 << 10;
    p->sharedMemPerBlockOptin = 227 << 10;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->totalGlobalMem = size_t(1) << 34;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    return cudaSuccess;
}
const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "not available on the host (cuda_host.cpp)"; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t* e) {
    if (e) *e = reinterpret_cast<cudaEvent_t>(std::malloc(1));
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    std::free(e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
    if (ms) *ms = 0.0f;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) {
    if (s) *s = reinterpret_cast<cudaStream_t>(std::malloc(1));
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    std::free(s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
// Streams report a capture in progress, so that the frontend's warmup (a fake execution with
// made-up pointers inside a CUDA graph capture, which on a GPU runs nothing) returns at once
// instead of running on the host.
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* st) {
    if (st) *st = cudaStreamCaptureStatusActive;
    return cudaSuccess;
}
// No CUDA graphs on the host.
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) { return cudaErrorNotSupported; }
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* g) {
    if (g) *g = nullptr;
    return cudaErrorNotSupported;
}
cudaError_t cudaGraphDestroy(cudaGraph_t) { return cudaSuccess; }
cudaError_t cudaGetDriverEntryPointByVersion(const char*, void** f, unsigned int, unsigned long long, cudaDriverEntryPointQueryResult* r) {
    if (f) *f = nullptr;
    if (r) *r = cudaDriverEntryPointSymbolNotFound;
    return cudaErrorNotSupported;
}
cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t, cudaFuncAttribute, int, int) { return cudaErrorNotSupported; }
cudaError_t cudaLaunchKernel(const void*, dim3, dim3, void**, size_t, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t cudaLibraryGetKernel(cudaKernel_t*, cudaLibrary_t, const char*) { return cudaErrorNotSupported; }
cudaError_t cudaLibraryLoadData(cudaLibrary_t*, const void*, cudaJitOption*, void**, unsigned int, cudaLibraryOption*, void**, unsigned int) {
    return cudaErrorNotSupported;
}
cudaError_t cudaLibraryUnload(cudaLibrary_t) { return cudaErrorNotSupported; }

// NVRTC (for the frontend's experimental engines): every call fails.
int nvrtcCreateProgram(void*, const char*, const char*, int, const char* const*, const char* const*) { return 1; }
int nvrtcCompileProgram(void*, int, const char* const*) { return 1; }
int nvrtcDestroyProgram(void*) { return 1; }
int nvrtcGetCUBIN(void*, char*) { return 1; }
int nvrtcGetCUBINSize(void*, size_t*) { return 1; }
int nvrtcGetPTX(void*, char*) { return 1; }
int nvrtcGetPTXSize(void*, size_t*) { return 1; }
int nvrtcGetProgramLog(void*, char*) { return 1; }
int nvrtcGetProgramLogSize(void*, size_t*) { return 1; }
}
