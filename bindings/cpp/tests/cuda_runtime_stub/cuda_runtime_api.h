// A compile-only stand-in for the CUDA toolkit's cuda_runtime_api.h (cuda.h and cuda_runtime.h
// beside it): just what LibTorch's c10/cuda headers use, so that the STOKER_WITH_TORCH_CUDA part of
// stoker/torch.hpp is compiled on machines without a CUDA toolkit (tests/torch_cuda_header.cpp).
// Never linked or run.
#pragma once
#include <cstddef>
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorNotReady = 600 };
typedef enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault } cudaMemcpyKind;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
inline const char* cudaGetErrorString(cudaError_t) { return ""; }
inline cudaError_t cudaGetLastError() { return 0; }
inline cudaError_t cudaStreamQuery(cudaStream_t) { return 0; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return 0; }
inline cudaError_t cudaMemcpyAsync(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t) { return 0; }
inline cudaError_t cudaDeviceSynchronize() { return 0; }
#define cudaStreamNonBlocking 1
typedef enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0 } cudaStreamCaptureStatus;
inline cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus*) { return 0; }
inline cudaError_t cudaStreamGetPriority(cudaStream_t, int*) { return 0; }
inline cudaError_t cudaDeviceGetStreamPriorityRange(int*, int*) { return 0; }
