// SEQPAR_HOST_DEVICE: a function both the C++ compiler and nvcc compile, for the
// arithmetic that the CPU paths and the CUDA kernels must share bit for bit.
#pragma once

#ifdef __CUDACC__
#define SEQPAR_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SEQPAR_HOST_DEVICE inline
#endif
