/* The few CUDA runtime types cudnn.h names, for building the C API's test programs on a
 * machine without the CUDA toolkit (host-pointer builds, without -DGPU). GPU builds use the
 * toolkit's own header instead. */
#ifndef FERRODNN_CUDA_STUB_RUNTIME_API_H
#define FERRODNN_CUDA_STUB_RUNTIME_API_H
#include <stddef.h>
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
#endif
