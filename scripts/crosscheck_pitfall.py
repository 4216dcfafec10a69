#!/usr/bin/python3
"""Recomputes a pitfall scenario's step-1 figures with PyTorch, from the run's dump.

    seqpar-repro --scenario shifted-targets --dump DIR [...]  &&  scripts/crosscheck_pitfall.py DIR

DIR is what the scenario's --dump wrote: inputs.safetensors (x, the initial weight and
bias; the configuration as metadata), reference.safetensors and variant<i>.safetensors,
each holding rank 0's combined gradient at step 1 (grad.weight, grad.bias) and the norm
the step clipped with (clip_norm). For every variant this script computes, with torch
autograd on float32, each sp x dp rank's gradient of its own loss on its own rows, combines
them the way the variant says, and takes the variant's clip norm; the variant's names
are the ones the report prints. Then:
  - the combined gradient must match the dump's to 1e-5 of the one-rank gradient's norm;
  - the clip norm must match to relative 1e-5;
  - exact variants' gradients must equal the one-rank gradient in the dump bit for bit
    (seqpar's claim), and PyTorch's one-rank gradient to 1e-5.
Scenarios: shifted-targets, clipping-norms. Exit status 1 when anything differs.
"""
import os
import sys
import tomllib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from crosscheck import read_safetensors  # noqa: E402

TOLERANCE = 1e-5


def shard(rows, sp, r):
    """torch.tensor_split's rows of rank r: the first rows % sp ranks get one more."""
    base, extra = divmod(rows, sp)
    first = r * base + min(r, extra)
    return first, base + (1 if r < extra else 0)


def gradient(weight, bias, x_rows, targets, divisor):
    w = weight.clone().requires_grad_(True)
    b = bias.clone().requires_grad_(True)
    loss = (torch.nn.functional.linear(x_rows, w, b) - targets).abs().sum() / divisor
    loss.backward()
    return torch.cat([w.grad.flatten(), b.grad])


def shifted_targets(x, weight, bias, cfg):
    rows, sp, dp, out = cfg["rows"], cfg["sp"], cfg["dp"], cfg["out"]
    flat_all = dp * (rows - 1) * out
    reference = sum(gradient(weight, bias, x[d * rows:d * rows + rows - 1],
                             x[d * rows + 1:d * rows + rows, :out], flat_all) for d in range(dp))

    def partials(pre_shifted, divisor):
        parts = []
        for d in range(dp):
            for r in range(sp):
                first, count = shard(rows, sp, r)
                first += d * rows
                n = count - 1 if (not pre_shifted or r == sp - 1) else count
                div = n * out if divisor == "mean" else divisor
                parts.append(gradient(weight, bias, x[first:first + n], x[first + 1:first + 1 + n, :out], div))
        return parts

    def sum_sp_avg_dp(parts):
        return sum(parts) / dp

    def average(parts):
        return sum(parts) / len(parts)

    variants = {
        "shard-local shift, mean, averaged": average(partials(False, "mean")),
        "shard-local shift, global count": sum_sp_avg_dp(partials(False, (rows - sp) * out)),
        "pre-shifted, global count": sum_sp_avg_dp(partials(True, (rows - 1) * out)),
        "pre-shifted, exact sums": sum(partials(True, flat_all)),
    }
    return reference, {name: (g, g.norm().item()) for name, g in variants.items()}


def clipping_norms(x, weight, bias, cfg):
    rows, sp, dp, out = cfg["rows"], cfg["sp"], cfg["dp"], cfg["out"]
    reference = gradient(weight, bias, x, x[:, :out], dp * rows * out)

    def partials(divisor):
        parts = []
        for d in range(dp):
            for r in range(sp):
                first, count = shard(rows, sp, r)
                first += d * rows
                parts.append(gradient(weight, bias, x[first:first + count], x[first:first + count, :out], divisor))
        return parts

    parts = partials(rows * out)
    combined = sum(parts) / dp
    world = sp * dp
    squares = []
    for r in range(world):
        first, count = shard(combined.numel(), world, r)
        squares.append(combined[first:first + count].double().pow(2).sum().item())
    exact = sum(partials(dp * rows * out))
    variants = {
        "mean of the ranks' partial norms": (combined, sum(p.norm().item() for p in parts) / world),
        "replicated gradient, squares summed": (combined, (world * combined.norm().item() ** 2) ** 0.5),
        "each element once (sharded squares)": (combined, sum(squares) ** 0.5),
        "exact gradient, its own norm": (exact, exact.norm().item()),
    }
    return reference, variants


SCENARIOS = {"shifted-targets": shifted_targets, "clipping-norms": clipping_norms}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    directory = sys.argv[1]
    inputs, metadata = read_safetensors(os.path.join(directory, "inputs.safetensors"))
    config = tomllib.loads(metadata["config"])
    ds, repro = config["ds_config"], config["repro"]
    scenario = repro["scenario"]
    if scenario not in SCENARIOS:
        sys.exit(f"{directory}: scenario {scenario!r} is not one this script recomputes ({', '.join(SCENARIOS)})")
    cfg = {"rows": repro["rows"], "sp": ds["sequence_parallel_size"], "dp": ds["data_parallel_size"],
           "out": repro["out_features"]}
    torch.set_grad_enabled(True)
    reference, variants = SCENARIOS[scenario](inputs["x"], inputs["weight"], inputs["bias"], cfg)
    ours_reference, _ = read_safetensors(os.path.join(directory, "reference.safetensors"))
    flat = lambda t: torch.cat([t["grad.weight"].flatten(), t["grad.bias"]])  # noqa: E731
    scale = reference.norm().item()
    failures = []

    def compare(name, ours, theirs):
        error = (ours - theirs).norm().item() / scale
        status = "ok" if error <= TOLERANCE else "DIFFERS"
        print(f"  {name:40s} gradient error {error:.2e}  {status}")
        if error > TOLERANCE:
            failures.append(f"{name}: gradient differs from PyTorch's by {error:.3g} of the norm")

    print(f"{scenario}: sp {cfg['sp']} x dp {cfg['dp']}, {cfg['rows']} rows per replica")
    compare("one rank", flat(ours_reference), reference)
    for i, (name, (torch_gradient, torch_clip)) in enumerate(variants.items()):
        ours, _ = read_safetensors(os.path.join(directory, f"variant{i}.safetensors"))
        compare(name, flat(ours), torch_gradient)
        clip = ours["clip_norm"].item()
        clip_error = abs(clip - torch_clip) / torch_clip
        print(f"  {'':40s} clip norm {clip:.6g} vs PyTorch {torch_clip:.6g}  "
              f"{'ok' if clip_error <= TOLERANCE else 'DIFFERS'}")
        if clip_error > TOLERANCE:
            failures.append(f"{name}: clip norm {clip} differs from PyTorch's {torch_clip}")
        if "exact" in name and not torch.equal(flat(ours), flat(ours_reference)):
            failures.append(f"{name}: not bitwise the one-rank gradient")
    if failures:
        print("\n".join(["FAILED:"] + failures))
        sys.exit(1)
    print(f"{scenario}: every variant agrees with PyTorch")


if __name__ == "__main__":
    main()
