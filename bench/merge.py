#!/usr/bin/env python3
"""Sets seqpar-bench's figures beside bench/torch_reference.py's (bench/run.sh calls it).

  python3 bench/merge.py SEQPAR_JSON TORCH_JSON OUT_JSON [MORE_SEQPAR_JSON ...]

MORE_SEQPAR_JSON: further seqpar-bench files whose figures join the first's, such as
seqpar-bench --nproc 2's (the step on 2 GPUs over NCCL); a missing file is noted.

Prints a Markdown table: our median, the anchor's median from the same run, the
ratio anchor / ours (above 1: we are faster), and two floors: the bytes the work must
move over the measured device copy bandwidth, and its flops at cuBLAS's measured fp32
rate (the 4096^3 GEMM).
"""
import json
import sys

ROWS = [
    ("Seed step 12000 rows, one batch (x in L2), graph, exact numerics (ExactL1Step: the public API's bits)",
     "step/full12000/exact_graph", ["step/full12000/torch_graph", "step/full12000/torch_eager"]),
    ("  same, eager launches", "step/full12000/exact_eager", ["step/full12000/torch_eager"]),
    ("  same, public API (autograd), eager", "step/full12000/public_api", ["step/full12000/torch_eager"]),
    ("    its host time to enqueue a step (the stream idle before each)", "step/full12000/public_api_host", []),
    ("Seed step, one SP shard (3000 rows), graph, exact numerics", "step/shard3000/exact_graph",
     ["step/shard3000/torch_graph", "step/shard3000/torch_eager"]),
    ("  same, public API, eager", "step/shard3000/public_api", ["step/shard3000/torch_eager"]),
    ("Seed step, 4 ranks (threads, 1 GPU), public API, eager", "step/4ranks_threads/public_api",
     ["step/4shards_one_process/torch_eager"]),
    ("Seed step, 2 GPUs over NCCL (6000 rows each), exact numerics (the digits' all-reduce), graph",
     "step/2gpu_nccl/exact_graph", ["step/2gpu_nccl/torch_graph", "step/2gpu_nccl/torch_eager"]),
    ("  same, eager", "step/2gpu_nccl/exact_eager", ["step/2gpu_nccl/torch_eager"]),
    ("  same, graph replays back to back (per step)", "step/2gpu_nccl/exact_graph_back_to_back",
     ["step/2gpu_nccl/torch_graph_back_to_back"]),
    ("All-reduce of the exact step's digits (820 KB of int64), 2 GPUs, graph",
     "allreduce/2gpu_nccl/820KB_digits/seqpar_graph", ["allreduce/2gpu_nccl/41KB_grads/torch_graph"]),
    ("Linear fwd 12000x640->16", "kernel/linear_fwd/12000x640x16", ["kernel/linear_fwd/12000x640x16/cublas"]),
    ("Linear fwd 3000x640->16", "kernel/linear_fwd/3000x640x16", ["kernel/linear_fwd/3000x640x16/cublas"]),
    ("dW+db, K=12000", "kernel/linear_dw_db/12000x640x16",
     ["kernel/linear_dw_db/12000x640x16/cublas", "kernel/linear_dw/12000x640x16/cublas"]),
    ("dW+db, K=3000", "kernel/linear_dw_db/3000x640x16", ["kernel/linear_dw_db/3000x640x16/cublas"]),
    ("dW+db, K=12000, an L1 loss's dy (fixed point, int8 tensor cores)", "kernel/linear_dw_db_l1/12000x640x16",
     ["kernel/linear_dw_db/12000x640x16/cublas", "kernel/linear_dw/12000x640x16/cublas"]),
    ("dW alone, K=12000, a randn dy: exact, binned row sums", "kernel/linear_dw_randn_binned/12000x640x16",
     ["kernel/linear_dw/12000x640x16/cublas"]),
    ("  same, exact, CRT on the int8 tensor cores", "kernel/linear_dw_randn_crt/12000x640x16",
     ["kernel/linear_dw/12000x640x16/cublas"]),
    ("L1 fwd + bwd, 12000x16", "kernel/l1_fwd_bwd/12000x16", ["kernel/l1_fwd_bwd/12000x16/torch"]),
    ("AdamW, 10,256 params", "kernel/adamw/10256", ["kernel/adamw/10256/torch_fused", "kernel/adamw/10256/torch_foreach"]),
    ("AdamW, 100 M params", "kernel/adamw/100000000",
     ["kernel/adamw/100000000/torch_fused", "kernel/adamw/100000000/torch_foreach"]),
    ("Grad norm + clip, 10,256", "kernel/norm_clip/10256", ["kernel/norm_clip/10256/torch"]),
    ("Attention, 1024 tokens x 2 heads of 16 (one sp-4 rank's share), causal, exact: forward",
     "kernel/attention_fwd/1024x2x16", ["kernel/attention_fwd/1024x2x16/torch_sdpa"]),
    ("  same, forward + backward", "kernel/attention_fwd_bwd/1024x2x16",
     ["kernel/attention_fwd_bwd/1024x2x16/torch_sdpa"]),
    ("Attention, 1024 tokens x 8 heads of 16 (the whole model), causal, exact: forward",
     "kernel/attention_fwd/1024x8x16", ["kernel/attention_fwd/1024x8x16/torch_sdpa"]),
    ("  same, forward + backward", "kernel/attention_fwd_bwd/1024x8x16",
     ["kernel/attention_fwd_bwd/1024x8x16/torch_sdpa"]),
    ("GEMM 4096^3 (y = x W^T + b), 128x128 tiles", "gemm/4096^3", ["gemm/4096^3/cublas"]),
    ("Stress GEMM 1048576x1024x1024", "gemm/stress_fwd/1048576x1024x1024",
     ["gemm/stress_fwd/1048576x1024x1024/cublas"]),
    ("Stress dW = dy^T x (exact row sums), 1024x1024 over 1048576 rows", "gemm/stress_dw/1024x1024x1048576",
     ["gemm/stress_dw/1024x1024x1048576/cublas"]),
    ("  same, an L1 loss's dy (fixed point, int8 tensor cores)", "gemm/stress_dw_l1/1024x1024x1048576",
     ["gemm/stress_dw/1024x1024x1048576/cublas"]),
    ("  same, a randn dy, exact by the CRT on the int8 tensor cores", "gemm/stress_dw_randn_crt/1024x1024x1048576",
     ["gemm/stress_dw/1024x1024x1048576/cublas"]),
    ("Stress dx = dy W, 1048576x1024x1024", "gemm/stress_dx/1048576x1024x1024",
     ["gemm/stress_dx/1048576x1024x1024/cublas"]),
    ("Stress step, x 1048576x1024, Linear 1024->1024", "step/stress/public_api", ["step/stress/torch_eager"]),
    ("Device copy 1 GiB", "copy/1GiB", ["copy/1GiB/torch"]),
]


def load(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as error:
        print(f"(could not read {path}: {error})")
        return {}, {}
    return {r["name"]: r for r in data.get("results", [])}, data


def main():
    ours, ours_doc = load(sys.argv[1])
    theirs, theirs_doc = load(sys.argv[2])
    for path in sys.argv[4:]:
        more, more_doc = load(path)
        ours.update(more)
        ours_doc = dict(ours_doc, results=(ours_doc.get("results") or []) + (more_doc.get("results") or []))
        ours_doc.setdefault("gpu", more_doc.get("gpu"))
    copy = ours.get("copy/1GiB")
    bandwidth = copy["bytes"] / (copy["median_us"] * 1e-6) if copy else None
    gemm = theirs.get("gemm/4096^3/cublas")
    fp32_rate = gemm["flops"] / (gemm["median_us"] * 1e-6) if gemm else None
    print(f"GPU: {ours_doc.get('gpu', '?')}; torch {theirs_doc.get('torch', '?')}; device copy "
          f"{bandwidth / 1e12 if bandwidth else float('nan'):.2f} TB/s (read + write); cuBLAS fp32 "
          f"{fp32_rate / 1e12 if fp32_rate else float('nan'):.1f} TFLOPS at 4096^3\n")
    print("| figure | seqpar us | anchor | anchor us | anchor / seqpar | bytes floor us | flop floor us |")
    print("|---|---:|---|---:|---:|---:|---:|")
    merged = []
    for label, name, anchors in ROWS:
        mine = ours.get(name)
        for anchor in anchors or ["-"]:  # "-": a figure with no PyTorch counterpart
            parts = [theirs.get(a) for a in anchor.split("+")]
            anchor_us = sum(p["median_us"] for p in parts) if all(parts) else None
            our_us = mine["median_us"] if mine else None
            ratio = anchor_us / our_us if anchor_us and our_us else None
            bytes_floor = mine["bytes"] / bandwidth * 1e6 if mine and bandwidth and mine["bytes"] else None
            flop_floor = mine["flops"] / fp32_rate * 1e6 if mine and fp32_rate and mine["flops"] else None
            fmt = lambda v, f="{:.2f}": f.format(v) if v is not None else "n/a"
            print(f"| {label} | {fmt(our_us)} | {anchor} | {fmt(anchor_us)} | {fmt(ratio, '{:.2f}x')} | "
                  f"{fmt(bytes_floor)} | {fmt(flop_floor)} |")
            merged.append(dict(figure=label, seqpar=name, seqpar_us=our_us, anchor=anchor,
                               anchor_us=anchor_us, anchor_over_seqpar=ratio,
                               bytes_floor_us=bytes_floor, flop_floor_us=flop_floor))
            label = "  (same)"
    with open(sys.argv[3], "w") as f:
        json.dump(dict(gpu=ours_doc.get("gpu"), torch=theirs_doc.get("torch"),
                       copy_bandwidth_bytes_per_s=bandwidth, cublas_fp32_flops_per_s=fp32_rate,
                       rows=merged, seqpar=ours_doc.get("results"), torch_results=theirs_doc.get("results")),
                  f, indent=1)


if __name__ == "__main__":
    main()
