#!/usr/bin/python3
"""Recomputes the zero-stage scenario's table with PyTorch's own collectives.

    seqpar-repro --scenario zero-stage --json FILE [...]  &&  scripts/crosscheck_zero_stage.py FILE

Starts sp x dp processes with torch.distributed (gloo, on the CPU) and, for every loss
convention and reduction in FILE, takes one step's gradient as a user of PyTorch and
DeepSpeed would:
  - local mean / global row count: the L1 loss of the rank's own rows, divided by its
    own element count or by the global one;
  - all-gather, sum backward: torch.distributed.nn.functional.all_gather (its backward
    sums each slice's gradient over the ranks), or, with dp > 1, that convention
    written out (torch 1.13's gloo path fails on sub-groups);
  - all-gather, slice backward: an all-gather whose backward keeps the rank's own slice,
    as DeepSpeed's sequence/cross_entropy.py does;
  - ZeRO 0-2: all_reduce SUM over sp x dp, divided by dp; ZeRO-3: all_reduce SUM over
    sp x dp divided by sp x dp (an average); exact sums: the plain sum over sp x dp.
Each variant's gradient norm over the one-rank gradient's must match FILE's
gradient_scale (relative 1e-4), and every rank must hold the same reduced gradient.
The data are PyTorch's own random numbers of FILE's sizes: the factors do not depend
on them. Exit status 1 when anything differs.
"""
import json
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as distnn
import torch.multiprocessing as mp


class GatherSliceBackward(torch.autograd.Function):
    """All-gather of rows whose backward keeps the rank's own slice."""

    @staticmethod
    def forward(ctx, y, group, rank, size):
        parts = [torch.empty_like(y) for _ in range(size)]
        dist.all_gather(parts, y.contiguous(), group=group)
        ctx.rows, ctx.rank = y.shape[0], rank
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad):
        return grad[ctx.rank * ctx.rows:(ctx.rank + 1) * ctx.rows].clone(), None, None, None


class GatherSumBackward(torch.autograd.Function):
    """PyTorch's all_gather convention written out: the backward sums each slice's
    gradient over the ranks (a reduce-scatter). For sub-groups only: torch 1.13's gloo
    path of torch.distributed.nn.functional.all_gather indexes them by global rank."""

    @staticmethod
    def forward(ctx, y, group, rank, size):
        parts = [torch.empty_like(y) for _ in range(size)]
        dist.all_gather(parts, y.contiguous(), group=group)
        ctx.rows, ctx.rank, ctx.group = y.shape[0], rank, group
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad):
        whole = grad.contiguous().clone()
        dist.all_reduce(whole, group=ctx.group)
        return whole[ctx.rank * ctx.rows:(ctx.rank + 1) * ctx.rows].clone(), None, None, None


def worker(rank, world, port, spec, out_path):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sp, dp, rows = spec["sequence_parallel_size"], spec["data_parallel_size"], spec["rows"]
    in_features, out_features = spec["in_features"], spec["out_features"]
    sp_groups = [dist.new_group(list(range(r * sp, (r + 1) * sp))) for r in range(dp)]
    sp_group, sp_rank, dp_rank = sp_groups[rank // sp], rank % sp, rank // sp

    torch.manual_seed(7)  # the same data and initial parameters on every rank
    x = torch.randn(dp * rows, in_features)
    init = torch.nn.Linear(in_features, out_features)
    target = x[:, :out_features]

    def fresh():
        model = torch.nn.Linear(in_features, out_features)
        model.load_state_dict(init.state_dict())
        return model

    def norm(model):
        return float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm())

    reference = fresh()
    (target - reference(x)).abs().mean().backward()
    reference_norm = norm(reference)

    n = rows // sp
    replica = slice(dp_rank * rows, (dp_rank + 1) * rows)
    mine = slice(dp_rank * rows + sp_rank * n, dp_rank * rows + (sp_rank + 1) * n)
    results = []
    for variant in spec["variants"]:
        model = fresh()
        y = model(x[mine])
        if variant["loss"] == "local mean":
            loss = (target[mine] - y).abs().mean()
        elif variant["loss"] == "global row count":
            loss = (target[mine] - y).abs().sum() / (dp * rows * out_features)
        elif variant["loss"] == "all-gather, sum backward":
            if dp == 1:  # PyTorch's own differentiable all-gather
                gathered = torch.cat(distnn.all_gather(y, group=sp_group))
            else:
                gathered = GatherSumBackward.apply(y, sp_group, sp_rank, sp)
            loss = (target[replica] - gathered).abs().mean()
        else:
            gathered = GatherSliceBackward.apply(y, sp_group, sp_rank, sp)
            loss = (target[replica] - gathered).abs().mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)  # SUM over sp x dp
            # "exact sums": seqpar adds the rows over sp x dp exactly inside backward; in
            # PyTorch that is the float sum over sp x dp.
            p.grad /= {"ZeRO 0-2": dp, "ZeRO-3": sp * dp, "exact sums": 1}[variant["reduction"]]
        flat = torch.cat([p.grad.flatten() for p in model.parameters()])
        gathered_grads = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered_grads, flat)
        agree = all(torch.equal(g, gathered_grads[0]) for g in gathered_grads)
        results.append({"loss": variant["loss"], "reduction": variant["reduction"],
                        "scale": norm(model) / reference_norm, "ranks_agree": agree})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(path):
    with open(path) as f:
        spec = json.load(f)
    if spec.get("schema") != "seqpar-repro-zero-stage/2":
        sys.exit(f"{path}: not a zero-stage JSON (schema {spec.get('schema')!r})")
    world = spec["sequence_parallel_size"] * spec["data_parallel_size"]
    with tempfile.TemporaryDirectory() as scratch:
        out_path = os.path.join(scratch, "torch.json")
        mp.spawn(worker, args=(world, free_port(), spec, out_path), nprocs=world)
        with open(out_path) as f:
            theirs = json.load(f)
    failures = []
    for ours, torch_run in zip(spec["variants"], theirs):
        label = f"{ours['loss']} / {ours['reduction']}"
        if abs(ours["gradient_scale"] - torch_run["scale"]) > 1e-4 * abs(torch_run["scale"]):
            failures.append(f"{label}: seqpar {ours['gradient_scale']:.6g}, PyTorch {torch_run['scale']:.6g}")
        if not torch_run["ranks_agree"]:
            failures.append(f"{label}: PyTorch's ranks hold different gradients")
        if not ours["ranks_agree"]:
            failures.append(f"{label}: seqpar's ranks hold different parameters")
        print(f"crosscheck: {label:42s} seqpar {ours['gradient_scale']:.5g}  "
              f"PyTorch {torch_run['scale']:.5g}")
    if len(theirs) != len(spec["variants"]):
        failures.append(f"{len(spec['variants'])} variants in {path}, {len(theirs)} recomputed")
    for failure in failures:
        print("  MISMATCH", failure)
    print("crosscheck:", "FAILED" if failures else
          f"PyTorch {torch.__version__} (gloo, {world} processes) gives the same factors")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
