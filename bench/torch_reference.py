#!/usr/bin/env python3
"""PyTorch anchors for seqpar-bench, on the same GPU, timed the same way:
CUDA events around each call, a warm-up, the median of many calls.

  python3 bench/torch_reference.py [--repeats N] [--warmup N] [--json PATH] [--no-stress]
                                   [--only-nccl]

The step is the issue's: Linear(640 -> 16), L1 loss against x[:, :16], backward,
clip_grad_norm_(1.0), AdamW(lr 1e-4, weight_decay 0.01); eager (AdamW's default
foreach path) and captured into one CUDA graph (AdamW(capturable=True), the recipe of
PyTorch's CUDA graphs notes). Matmuls in fp32 with TF32 off (cuBLAS fp32).

With 2 GPUs, the same step over NCCL (bench_nccl_step): 2 processes, each holding 6000
of the 12000 rows, as seqpar-bench --nproc 2 takes it (the figures step/2gpu_nccl/...
and allreduce/2gpu_nccl/...). --only-nccl runs that part alone; --nccl-world 4 runs it on
4 GPUs (step/4gpu_nccl/..., beside seqpar-bench --nproc 4).
"""
import argparse
import json
import os
import socket
import tempfile

import torch
import torch.nn.functional as F

ROWS, IN, OUT, SHARDS = 12000, 640, 16, 4
records = []


def time_calls(fn, warmup, repeats):
    """Back to back, as seqpar-bench: an event after every call, no host wait in
    between; each interval is one call's device time in a steady stream of calls."""
    stream = torch.cuda.current_stream()
    for _ in range(warmup):
        fn()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(repeats + 1)]
    events[0].record(stream)
    for i in range(repeats):
        fn()
        events[i + 1].record(stream)
    events[-1].synchronize()
    times = sorted(1000.0 * events[i].elapsed_time(events[i + 1]) for i in range(repeats))
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
    bench_attention(args)


def bench_attention(args):
    """seqpar-bench's attention rows: 1024 tokens, heads of 16, causal, fp32, through
    F.scaled_dot_product_attention (PyTorch picks its kernel; fp32 rules out flash)."""
    tokens, head_dim = 1024, 16
    for heads in (2, 8):
        q, k, v, g = (torch.randn(1, heads, tokens, head_dim, device="cuda") for _ in range(4))
        shape = f"{tokens}x{heads}x{head_dim}"
        nbytes, flops = 4.0 * 4 * tokens * heads * head_dim, 2.0 * tokens * tokens * heads * head_dim
        with torch.no_grad():
            add(f"kernel/attention_fwd/{shape}/torch_sdpa", "F.scaled_dot_product_attention(is_causal=True)",
                time_calls(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), args.warmup,
                           args.repeats), nbytes, flops)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

        def step():
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
            torch.autograd.grad(out, (qg, kg, vg), g)
        add(f"kernel/attention_fwd_bwd/{shape}/torch_sdpa", "the same, forward + backward (autograd)",
            time_calls(step, args.warmup, args.repeats), 2 * nbytes, 3.5 * flops)


def bench_attention_long(args):
    """seqpar-bench's long attention rows: 8 query heads over 2 and over 8 kv heads, D 128,
    causal, at 4,096 to 131,072 tokens. The anchors: SDPA in fp32 through its
    memory-efficient backend (TF32 off), its math backend where its S x S scores fit, and
    FlashAttention in bf16, the speed of light. Flops as seqpar-bench counts them."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    heads, head_dim = 8, 128
    free = torch.cuda.mem_get_info()[0]
    for tokens in (4096, 16384, 65536, 131072):
        repeats = min(args.repeats, 3 if tokens >= 65536 else 10 if tokens >= 16384 else 30)
        warmup = min(args.warmup, 1)
        for kv_heads in (2, 8):
            shape = f"{tokens}x{heads}over{kv_heads}x{head_dim}"
            flops = 2.0 * tokens * tokens * heads * head_dim
            nbytes = 4.0 * (2 * tokens * heads + 2 * tokens * kv_heads) * head_dim
            anchors = [("torch_sdpa_mem_efficient", SDPBackend.EFFICIENT_ATTENTION, torch.float32),
                       ("torch_flash_bf16", SDPBackend.FLASH_ATTENTION, torch.bfloat16)]
            # The math backend keeps S x S scores per head, and as many again in backward.
            if 3 * 4.0 * tokens * tokens * heads < 0.6 * free:
                anchors.append(("torch_sdpa_math", SDPBackend.MATH, torch.float32))
            for name, backend, dtype in anchors:
                q = torch.randn(1, heads, tokens, head_dim, device="cuda", dtype=dtype, requires_grad=True)
                k, v = (torch.randn(1, kv_heads, tokens, head_dim, device="cuda", dtype=dtype,
                                    requires_grad=True) for _ in range(2))
                g = torch.randn(1, heads, tokens, head_dim, device="cuda", dtype=dtype)

                # The memory-efficient kernel takes no grouped-query heads: the kv heads
                # repeated for it, as its users do, inside the timed call.
                repeat = backend == SDPBackend.EFFICIENT_ATTENTION and kv_heads != heads

                def forward():
                    kk, vv = (t.repeat_interleave(heads // kv_heads, 1) for t in (k, v)) if repeat else (k, v)
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, kk, vv, is_causal=True,
                                                              enable_gqa=kv_heads != heads and not repeat)

                def step():
                    torch.autograd.grad(forward(), (q, k, v), g)
                try:
                    with torch.no_grad():
                        add(f"kernel/attention_long_fwd/{shape}/{name}", f"SDPA {backend.name} {dtype}",
                            time_calls(forward, warmup, repeats), nbytes, flops)
                    add(f"kernel/attention_long_fwd_bwd/{shape}/{name}", "the same, forward + backward",
                        time_calls(step, warmup, repeats), 2 * nbytes, 2.5 * flops)
                except Exception as error:  # a backend that refuses the shape
                    print(f"kernel/attention_long/{shape}/{name}: {error!r}"[:300], flush=True)
                del q, k, v, g
                torch.cuda.empty_cache()


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
        dy = torch.randn(rows, features, device="cuda")
        add("gemm/stress_dw/1024x1024x1048576/cublas", "dy^T @ x (cuBLAS fp32)",
            time_calls(lambda: torch.matmul(dy.t(), x), 1, 3),
            4.0 * (2 * rows * features + features * features), flops)
        add("gemm/stress_dx/1048576x1024x1024/cublas", "dy @ W (cuBLAS fp32)",
            time_calls(lambda: torch.matmul(dy, model.weight), 1, 3), 4.0 * 2 * rows * features, flops)
        del dy
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    add("step/stress/torch_eager", "x 1048576x1024, Linear 1024->1024, fp32, one step",
        time_calls(step_fn(model, opt, [(x, x, None)]), 1, 3), 4.0 * 2 * rows * features, 2.0 * flops)


def bench_copy(args):
    a = torch.ones(1 << 28, device="cuda")
    b = torch.empty_like(a)
    add("copy/1GiB/torch", "b.copy_(a), bytes read + written",
        time_calls(lambda: b.copy_(a), 5, max(20, args.repeats // 10)), 2.0 * 4 * (1 << 28))


# --- The step on 2 GPUs over NCCL, one process per GPU (torch.multiprocessing) ---

def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _nccl_worker(rank, world, port, warmup, repeats, out_path):
    """One rank: the exact policy's step on rows x.tensor_split(world)[rank], gradients
    summed over the ranks by one all-reduce of a flat buffer that holds both (as DDP
    with gradient_as_bucket_view=True), clip 1.0, AdamW. Timed as seqpar-bench times
    it: a barrier (a one-float all-reduce, then a stream sync), then the call between
    CUDA events; rank 0 writes the records to out_path."""
    import torch.distributed as dist
    # seqpar's deterministic NCCL defaults (dist/nccl_process_group.cpp): NVLS off, and
    # Ring + Simple only for worlds above two ranks (with two, every element is one
    # a + b whatever NCCL picks).
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if world > 2:
        os.environ.setdefault("NCCL_ALGO", "Ring")
        os.environ.setdefault("NCCL_PROTO", "Simple")
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    lead = rank == 0

    def say(text):
        if lead:
            print(text, flush=True)

    flag = torch.zeros(1, device=device)
    found = []

    def barrier():
        dist.all_reduce(flag)
        torch.cuda.current_stream().synchronize()

    def time_aligned(fn):
        stream = torch.cuda.current_stream()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for i in range(warmup + repeats):
            barrier()
            start.record(stream)
            fn()
            stop.record(stream)
            stop.synchronize()
            if i >= warmup:
                times.append(1000.0 * start.elapsed_time(stop))
        times.sort()
        return times[len(times) // 2], times[0], repeats

    def time_back_to_back(fn, rounds=5):
        stream = torch.cuda.current_stream()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(warmup):
            fn()
        per_call = []
        for _ in range(rounds):
            barrier()
            start.record(stream)
            for _ in range(repeats):
                fn()
            stop.record(stream)
            stop.synchronize()
            per_call.append(1000.0 * start.elapsed_time(stop) / repeats)
        per_call.sort()
        return per_call[len(per_call) // 2], per_call[0], rounds * repeats

    def add_world(name, what, timing, bytes_=0.0, flops=0.0):
        medians = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(world)]
        dist.all_gather(medians, torch.tensor([timing[0]], dtype=torch.float64, device=device))
        if lead:
            text = what + " (rank medians: " + ", ".join(f"{m.item():.2f}" for m in medians) + " us)"
            add(name, text, timing, bytes_, flops)

    def same_on_every_rank(values):
        values = values.detach().reshape(-1).contiguous()
        gathered = [torch.empty_like(values) for _ in range(world)]
        dist.all_gather(gathered, values)
        differing = sum(int((g != gathered[0]).sum()) for g in gathered[1:])
        max_abs = max([float((g - gathered[0]).abs().max()) for g in gathered[1:]] + [0.0])
        return differing, max_abs

    def check(ok, text):
        found.append(ok)
        say(("PASS " if ok else "FAIL ") + text)

    def flat_params(model):
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def check_ranks_agree(model, steps, after):
        differing, max_abs = same_on_every_rank(flat_params(model))
        check(differing == 0, f"torch, after {steps} steps ({after}): parameters on all {world} ranks "
              f"{'bitwise equal' if differing == 0 else 'DIFFER'} ({differing} values differ, "
              f"max |diff| {max_abs:.3g})")

    try:
        say(f"torch {torch.__version__} over NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}: "
            f"world of {world} on {torch.cuda.get_device_name(device)}; NCCL_ALGO={os.environ.get('NCCL_ALGO', '(NCCL picks)')} "
            f"NCCL_PROTO={os.environ.get('NCCL_PROTO', '(NCCL picks)')} NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}")
        torch.manual_seed(12345)  # the model, then x: the same on every rank
        x = torch.randn(ROWS, IN, device=device)
        shard = x.tensor_split(world)[rank]
        target = shard[:, :OUT]
        rows = shard.shape[0]
        nbytes, flops = 4.0 * rows * IN, 4.0 * rows * IN * OUT
        label = f"{world}gpu_nccl"

        def make_model():
            torch.manual_seed(12345)
            model = torch.nn.Linear(IN, OUT).to(device)
            params = list(model.parameters())
            flat = torch.zeros(sum(p.numel() for p in params), device=device)
            offset = 0
            for p in params:  # the gradients as views of one flat buffer
                p.grad = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
            return model, flat

        def step_fn(model, optimizer, flat):
            params = list(model.parameters())

            def step():
                optimizer.zero_grad(set_to_none=False)
                loss = (model(shard) - target).abs().sum() / (ROWS * OUT)
                loss.backward()
                dist.all_reduce(flat)  # sum: both gradients in one call
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                return loss
            return step

        def grads_in(model, flat):  # backward accumulated into the flat buffer, in place
            return all(p.grad.data_ptr() == flat.data_ptr() + 4 * offset
                       for p, offset in zip(model.parameters(), (0, OUT * IN)))

        def graph_of(fn, warmup_calls=3):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup_calls):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                fn()
            return graph

        # The all-reduce alone: 10256 floats (41 KB), zeros so the sums stay zero.
        grads = torch.zeros(OUT * IN + OUT, device=device)
        add_world(f"allreduce/{label}/41KB_grads/torch_eager", "dist.all_reduce of the flat gradient, eager",
                  time_aligned(lambda: dist.all_reduce(grads)))
        graph = graph_of(lambda: dist.all_reduce(grads))
        add_world(f"allreduce/{label}/41KB_grads/torch_graph", "the same all-reduce replayed from a CUDA graph",
                  time_aligned(graph.replay))
        del graph

        model, flat = make_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
        step = step_fn(model, optimizer, flat)
        add_world(f"step/{label}/torch_eager", "PyTorch eager, AdamW foreach, one all_reduce of flat grads",
                  time_aligned(step), nbytes, flops)
        check(grads_in(model, flat), "torch: the gradients stayed views of the flat all-reduced buffer")
        check_ranks_agree(model, warmup + repeats, "eager")

        model, flat = make_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, capturable=True)
        graph = graph_of(step_fn(model, optimizer, flat))
        add_world(f"step/{label}/torch_graph", "PyTorch, whole step with its all_reduce in one CUDA graph",
                  time_aligned(graph.replay), nbytes, flops)
        add_world(f"step/{label}/torch_graph_back_to_back", "replays back to back, no barrier, time per step",
                  time_back_to_back(graph.replay), nbytes, flops)
        check(grads_in(model, flat), "torch (graph): the gradients stayed views of the flat buffer")
        check_ranks_agree(model, 3 + 2 * warmup + 6 * repeats, "3 warm-up steps, then graph replays")
        del graph

        # 5 eager steps over the ranks against one process on all rows (mean loss).
        model, flat = make_model()
        split = step_fn(model, torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01), flat)
        for _ in range(5):
            loss = split().detach().clone()  # this rank's part of the global loss
        dist.all_reduce(loss)
        torch.manual_seed(12345)
        whole = torch.nn.Linear(IN, OUT).to(device)
        whole_opt = torch.optim.AdamW(whole.parameters(), lr=1e-4, weight_decay=0.01)
        for _ in range(5):
            whole_opt.zero_grad()
            whole_loss = F.l1_loss(whole(x), x[:, :OUT])
            whole_loss.backward()
            torch.nn.utils.clip_grad_norm_(whole.parameters(), 1.0)
            whole_opt.step()
        error = float((flat_params(model) - flat_params(whole)).abs().max() / flat_params(whole).abs().max())
        check(error < 1e-5, f"torch, 5 eager steps over {world} ranks vs one process on all {ROWS} rows: "
              f"loss {loss.item():.6f} vs {whole_loss.item():.6f}, parameters relative error {error:.2g}")
        check_ranks_agree(model, 5, "eager")
        if lead:
            with open(out_path, "w") as out:
                json.dump(dict(records=records, passed=all(found)), out)
    finally:
        dist.destroy_process_group()


def bench_nccl_step(args):
    count = torch.cuda.device_count()
    world = args.nccl_world
    if count < world:
        print(f"step/{world}gpu_nccl: skipped, it needs {world} GPUs and this machine has {count}",
              flush=True)
        return
    import torch.multiprocessing as mp
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory() as folder:
        out_path = os.path.join(folder, "nccl_records.json")
        mp.spawn(_nccl_worker, args=(world, _free_port(), args.warmup, args.repeats, out_path),
                 nprocs=world, join=True)
        with open(out_path) as f:
            result = json.load(f)
    records.extend(result["records"])
    if not result["passed"]:
        print("bench_nccl_step: a correctness check FAILED (see the FAIL lines above)", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--json", default="torch_reference.json")
    parser.add_argument("--no-stress", action="store_true")
    parser.add_argument("--only-nccl", action="store_true", help="only the step on GPUs over NCCL")
    parser.add_argument("--attention-only", action="store_true",
                        help="only attention at 4,096 to 131,072 tokens (seqpar-bench --attention-only)")
    parser.add_argument("--nccl-world", type=int, default=2,
                        help="GPUs for the NCCL step (default 2; seqpar-bench --nproc N is its twin)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    print(f"torch {torch.__version__} on {props.name}: median of {args.repeats} calls "
          f"after {args.warmup} warm-up calls")
    sections = (bench_copy, bench_steps, bench_kernels, bench_attention_long) + \
        (() if args.no_stress else (bench_stress,))
    if args.only_nccl:
        sections = (bench_nccl_step,)
    elif args.attention_only:
        sections = (bench_attention_long,)
    else:
        sections += (bench_nccl_step,)
    for section in sections:
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
