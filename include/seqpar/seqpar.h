// Everything a program that trains with seqpar uses, in one include (as <torch/torch.h>):
//
//   #include <seqpar/seqpar.h>
//
// Tensors and devices, autograd (reshape included), the modules (Linear, attention, RoPE,
// the Ulysses, context-parallel and USP layers), the L1 loss and the exact gradient
// sync, AdamW and clipping, and the process groups: everything docs/library.md shows. What it leaves out is still
// installed and included by its own path: the exact-sum arithmetic (core/exact_*.h), the
// internals that other headers include for themselves, and nn's kernels. (The command
// line, output files, safetensors writing and signal cleanup of seqpar's own programs
// are theirs, in apps/common.) The CUDA-only headers come in only when this copy of seqpar was built
// with CUDA (NCCL's with NCCL), as <seqpar/config.h> says.
#pragma once

#include <seqpar/config.h>
#include <seqpar/version.h>

// core: float32 tensors on a device, their arithmetic, random numbers.
#include <seqpar/core/copy.h>
#include <seqpar/core/cuda_runtime.h>
#include <seqpar/core/device.h>
#include <seqpar/core/device_buffer.h>
#include <seqpar/core/elementwise.h>
#include <seqpar/core/error.h>
#include <seqpar/core/exp.h>
#include <seqpar/core/generator.h>
#include <seqpar/core/nvtx.h>
#include <seqpar/core/storage.h>
#include <seqpar/core/tensor.h>

// autograd: Variables, the ops that record a graph, the backward engine.
#include <seqpar/autograd/engine.h>
#include <seqpar/autograd/node.h>
#include <seqpar/autograd/ops.h>
#include <seqpar/autograd/reshape.h>
#include <seqpar/autograd/variable.h>

// nn: modules, Linear, the L1 loss, dropout, gradients exact across ranks.
#include <seqpar/nn/attention.h>
#include <seqpar/nn/context_parallel_attention.h>
#include <seqpar/nn/dropout.h>
#include <seqpar/nn/exact_gradient_sync.h>
#include <seqpar/nn/exact_gradients.h>
#include <seqpar/nn/l1_loss.h>
#include <seqpar/nn/linear.h>
#include <seqpar/nn/long_context_block.h>
#include <seqpar/nn/module.h>
#include <seqpar/nn/rope.h>
#include <seqpar/nn/sequence_group.h>
#include <seqpar/nn/sequence_parallel_attention.h>
#include <seqpar/nn/ulysses_attention.h>
#include <seqpar/nn/ulysses_block.h>

// optim: AdamW and gradient-norm clipping.
#include <seqpar/optim/adamw.h>
#include <seqpar/optim/clip.h>

// dist: process groups (threads, NCCL), the ulysses x cp x dp mesh, launchers, consistency checks.
#include <seqpar/dist/all_to_all.h>
#include <seqpar/dist/consistency.h>
#include <seqpar/dist/environment.h>
#include <seqpar/dist/launcher.h>
#include <seqpar/dist/local_process_group.h>
#include <seqpar/dist/mesh.h>
#include <seqpar/dist/process_group.h>

#ifdef SEQPAR_WITH_CUDA
#include <seqpar/core/cuda_check.h>
#include <seqpar/core/device_generator.h>
#endif
#ifdef SEQPAR_WITH_NCCL
#include <seqpar/dist/nccl_process_group.h>
#endif
