/* libraryPropertyType as CUDA's library_types.h declares it (see cuda_runtime_api.h here). */
#ifndef FERRODNN_CUDA_STUB_LIBRARY_TYPES_H
#define FERRODNN_CUDA_STUB_LIBRARY_TYPES_H
typedef enum libraryPropertyType_t { MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL } libraryPropertyType;
#endif
