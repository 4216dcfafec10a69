#!/usr/bin/env python3
"""PyTorch anchors for seqpar-bench (issue 7), on the same GPU, timed the same way:
CUDA events around each call, a warm-up, the median of many calls.

  python3 bench/torch_reference.py [--repeats N] [--warmup N] [--json PATH] [--no-stress]

The step is the seed's: Linear(640 -> 16), L1 loss against x[:, :16], backward,
clip_grad_norm_(1.0), AdamW(lr 1e-4, weight_decay 0.01); eager (AdamW's default
foreach path) and captured into one CUDA graph (AdamW(capturable=True), the recipe of
PyTorch's CUDA graphs notes). Matmuls in fp32 with TF32 off (cuBLAS fp32).
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

ROWS, IN, OUT, SHARDS = 12000, 640, 16, 4
records = []


def time_calls(fn, warmup, repeats):
    stream = torch.cuda.current_stream()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record(stream)
        fn()
        stop.record(stream)
        stop.synchronize()
        times.append(1000.0 * start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2], times[0], repeats


def add(name, what, timing, bytes_=0.0, flops=0.0):
    median, minimum, repeats = timing
    records.append(dict(name=name, what=what, median_us=median, min_us=minimum,
                        repeats=repeats, bytes=bytes_, flops=flops))
    print(f"{name:<44} {median:12.2f} us  (min {minimum:10.2f}, {repeats:5d} reps)  {what}", flush=True)


def make_model(seed=12345):
    torch.manual_seed(seed)
    return torch.nn.Linear(IN, OUT).cuda()


def step_fn(model, optimizer, shards):
    """shards: list of (x, target, divisor); gradients summed over the shards (the
    exact policy's sum all-reduce, done here by accumulation in one process)."""
    params = list(model.parameters())

    def step():
        optimizer.zero_grad(set_to_none=False)
        for x, target, divisor in shards:
            loss = (model(x) - target).abs().sum() / divisor if divisor else F.l1_loss(model(x), target)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
    return step


def graphed(step, warmup_steps=3):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup_steps):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def bench_steps(args):
    x = torch.randn(ROWS, IN, device="cuda")
    full = [(x, x[:, :OUT], None)]
    shard = [(x[:ROWS // SHARDS], x[:ROWS // SHARDS, :OUT], ROWS * OUT)]
    four = [(s, s[:, :OUT], ROWS * OUT) for s in x.tensor_split(SHARDS)]
    step_bytes = 4.0 * ROWS * IN
    for label, shards, scale in (("full12000", full, 1), ("shard3000", shard, SHARDS),
                                 ("4shards_one_process", four, 1)):
        model = make_model()
        eager = step_fn(model, torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01), shards)
        add(f"step/{label}/torch_eager", "PyTorch eager, AdamW foreach",
            time_calls(eager, args.warmup, args.repeats), step_bytes / scale)
        model = make_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, capturable=True)
        graph = graphed(step_fn(model, optimizer, shards))
        add(f"step/{label}/torch_graph", "PyTorch, whole step in one CUDA graph",
            time_calls(graph.replay, args.warmup, args.repeats), step_bytes / scale)
    # Rotating over 4 batches (123 MB > L2): one graph per batch, shared parameters.
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, capturable=True)
    batches = [torch.randn(ROWS, IN, device="cuda") for _ in range(4)]
    graphs = [graphed(step_fn(model, optimizer, [(b, b[:, :OUT], None)])) for b in batches]
    counter = [0]

    def rotate():
        graphs[counter[0] % 4].replay()
        counter[0] += 1
    add("step/full12000/torch_graph_rotating", "PyTorch graphs over 4 batches of 30.7 MB",
        time_calls(rotate, args.warmup, args.repeats), step_bytes)


def bench_kernels(args):
    x = torch.randn(ROWS, IN, device="cuda")
    w, b = torch.randn(OUT, IN, device="cuda"), torch.randn(OUT, device="cuda")
    dy = torch.randn(ROWS, OUT, device="cuda")
    for rows in (ROWS, ROWS // SHARDS):
        xs, dys = x[:rows], dy[:rows]
        shape = f"{rows}x{IN}x{OUT}"
        nbytes, flops = 4.0 * (rows * IN + OUT * IN + rows * OUT), 2.0 * rows * IN * OUT
        add(f"kernel/linear_fwd/{shape}/cublas", "F.linear (cuBLAS fp32, TF32 off)",
            time_calls(lambda: F.linear(xs, w, b), args.warmup, args.repeats), nbytes, flops)
        add(f"kernel/linear_dw_db/{shape}/cublas", "dy^T @ x (cuBLAS fp32) + dy.sum(0)",
            time_calls(lambda: (dys.t() @ xs, dys.sum(0)), args.warmup, args.repeats), nbytes, flops)
        add(f"kernel/linear_dw/{shape}/cublas", "dy^T @ x alone (cuBLAS fp32)",
            time_calls(lambda: dys.t() @ xs, args.warmup, args.repeats), nbytes, flops)
    y = F.linear(x, w, b).detach().requires_grad_()
    target = x[:, :OUT]

    def l1():
        F.l1_loss(y, target).backward()
    add("kernel/l1_fwd_bwd/12000x16/torch", "F.l1_loss forward + backward (autograd)",
        time_calls(l1, args.warmup, args.repeats), 4.0 * 3 * ROWS * OUT)
    for count in (10256, 100_000_000):
        if count == 10256:
            params = [torch.nn.Parameter(w.clone()), torch.nn.Parameter(b.clone())]
        else:
            params = [torch.nn.Parameter(torch.randn(count, device="cuda"))]
        for p in params:
            p.grad = torch.randn_like(p)
        repeats = max(200, args.repeats // 2) if count > 1_000_000 else args.repeats
        for impl in ("foreach", "fused"):
            opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, **{impl: True})
            add(f"kernel/adamw/{count}/torch_{impl}", f"torch.optim.AdamW({impl}=True).step()",
                time_calls(opt.step, args.warmup, repeats), 4.0 * 7 * count)
        if count == 10256:
            add("kernel/norm_clip/10256/torch", "clip_grad_norm_(1.0), foreach",
                time_calls(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0), args.warmup, args.repeats),
                4.0 * 2 * count)


def bench_stress(args):
    n = 4096
    a, bmat = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    bias = torch.randn(n, device="cuda")
    add("gemm/4096^3/cublas", "F.linear 4096^3 (cuBLAS fp32, TF32 off)",
        time_calls(lambda: F.linear(a, bmat, bias), 3, min(args.repeats, 50)),
        4.0 * 3 * n * n, 2.0 * n ** 3)
    del a, bmat
    rows, features = 1 << 20, 1024
    x = torch.randn(rows, features, device="cuda")
    torch.manual_seed(9)
    model = torch.nn.Linear(features, features).cuda()
    flops = 2.0 * rows * features * features
    with torch.no_grad():
        add("gemm/stress_fwd/1048576x1024x1024/cublas", "F.linear (cuBLAS fp32)",
            time_calls(lambda: F.linear(x, model.weight, model.bias), 1, 3), 4.0 * 2 * rows * features, flops)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    add("step/stress/torch_eager", "x 1048576x1024, Linear 1024->1024, fp32, one step",
        time_calls(step_fn(model, opt, [(x, x, None)]), 1, 3), 4.0 * 2 * rows * features, 2.0 * flops)


def bench_copy(args):
    a = torch.ones(1 << 28, device="cuda")
    b = torch.empty_like(a)
    add("copy/1GiB/torch", "b.copy_(a), bytes read + written",
        time_calls(lambda: b.copy_(a), 5, max(20, args.repeats // 10)), 2.0 * 4 * (1 << 28))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--json", default="torch_reference.json")
    parser.add_argument("--no-stress", action="store_true")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    print(f"torch {torch.__version__} on {props.name}: median of {args.repeats} calls "
          f"after {args.warmup} warm-up calls")
    for section in (bench_copy, bench_steps, bench_kernels) + (() if args.no_stress else (bench_stress,)):
        try:
            section(args)
        except Exception as error:  # one failing section must not lose the others
            print(f"{section.__name__} failed: {error!r}", flush=True)
        torch.cuda.empty_cache()
    with open(args.json, "w") as out:
        json.dump(dict(source="torch_reference", torch=torch.__version__, gpu=props.name,
                       results=records), out, indent=1)


if __name__ == "__main__":
    main()
