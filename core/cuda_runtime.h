// The small slice of the CUDA runtime that the rest of seqpar needs, behind an
// interface that compiles without CUDA. In a CPU-only build every function that
// would touch a GPU throws an Error saying the build has no CUDA, and
// device_count() is 0.
//
// Streams: one current stream per device, created on first use and shared by every
// host thread (so the ranks of a LocalProcessGroup that share a GPU are ordered by
// that one stream). Memory comes from the stream-ordered allocator on the device's
// default memory pool, whose release threshold is raised so freed blocks stay in
// the pool, and steps can be captured into CUDA graphs; in front of it, a cache of
// freed blocks by size hands a block back without a driver call (ordered by the same
// one stream; bypassed while the stream is being captured).
#pragma once

#include <cstddef>

#include "core/device.h"

struct CUstream_st;  // the type behind cudaStream_t; declared here so CPU code can hold one

namespace seqpar::cuda {

using Stream = CUstream_st*;

bool built();
int device_count();

// Makes `device` current for the calling host thread.
void set_device(int device);

Stream current_stream(int device);

// Whether `stream` is being captured into a CUDA graph: then work may be enqueued but
// nothing waited for or read back.
bool capturing(Stream stream);

// The device's SM count (asked once), for grids sized to fill it.
int multiprocessor_count(int device);

// `bytes` of device memory (null for 0), and its release with the same `bytes`; both
// in the order of the device's stream.
void* allocate(size_t bytes, int device);
void release(void* pointer, size_t bytes, int device);
// Frees the blocks the cache holds to the pool (an allocation that finds the device
// full does it before it fails), and how many bytes it holds.
void release_cached(int device);
size_t cached_bytes(int device);

// Copies `bytes` between any two devices; returns once the destination holds the data
// when the destination is the host, in stream order otherwise.
void copy(void* destination, Device destination_device, const void* source,
          Device source_device, size_t bytes);

// Waits for everything queued on the device's current stream.
void synchronize(int device);

}  // namespace seqpar::cuda
