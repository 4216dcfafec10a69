"""PyTorch's attention on the CPU at seqpar-cpu-attention-bench's shape: causal, fp32,
F.scaled_dot_product_attention where this torch has it, else the matmul-softmax-matmul
of its definition; the same threads (torch.get_num_threads()). Median of --repeats after
one warm-up, wall time.

    python3 bench/torch_cpu_attention.py [--tokens S] [--heads H] [--kv-heads HKV] [--dim D] [--repeats N]
"""
import argparse
import time

import torch


def attention(q, k, v):
    if hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    s = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, -1) @ v


def median_seconds(call, repeats):
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main():
    parser = argparse.ArgumentParser()
    for name, default in (("tokens", 4096), ("heads", 8), ("kv-heads", 8), ("dim", 64), ("repeats", 3)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    torch.manual_seed(17)
    shape = (1, args.heads, args.tokens, args.dim)
    q, g = torch.randn(shape), torch.randn(shape)
    kv_shape = (1, args.kv_heads, args.tokens, args.dim)
    k, v = torch.randn(kv_shape), torch.randn(kv_shape)
    repeat = args.heads // args.kv_heads  # the kv heads repeated for the query heads

    def forward(q, k, v):
        return attention(q, k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1))

    with torch.no_grad():
        fwd = median_seconds(lambda: forward(q, k, v), args.repeats)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    step = median_seconds(lambda: torch.autograd.grad(forward(qg, kg, vg), (qg, kg, vg), g), args.repeats)
    print(f"torch {torch.__version__} cpu attention, causal, S {args.tokens}, {args.heads} heads over "
          f"{args.kv_heads}, D {args.dim}, {torch.get_num_threads()} threads: forward {fwd:.3f} s, "
          f"forward + backward {step:.3f} s")


if __name__ == "__main__":
    main()
