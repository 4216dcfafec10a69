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
    (seqpar's claim), and PyTorch's one-rank gradient to 1e-5;
  - the broken variants' gradients (PyTorch's) must be off the one-rank gradient.
Scenarios: shifted-targets, clipping-norms; crosscheck_dropout.py and
crosscheck_masked_tokens.py use load_dump and check_variants for theirs. Exit status 1
when anything differs.
"""
import os
import sys
import tomllib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from crosscheck import read_safetensors  # noqa: E402

TOLERANCE = 1e-5
BROKEN_AT_LEAST = 1e-3  # a broken variant's distance from the one-rank gradient, at least


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


def load_dump(directory, scenarios):
    """DIR/inputs.safetensors's tensors and its config's [ds_config] and [repro]; exits
    unless the dump is of one of `scenarios`."""
    inputs, metadata = read_safetensors(os.path.join(directory, "inputs.safetensors"))
    config = tomllib.loads(metadata["config"])
    ds, repro = config["ds_config"], config["repro"]
    if repro["scenario"] not in scenarios:
        sys.exit(f"{directory}: scenario {repro['scenario']!r} is not one this script recomputes "
                 f"({', '.join(scenarios)})")
    torch.set_grad_enabled(True)
    return inputs, ds, repro


def check_variants(directory, scenario, reference, variants, failures=(), broken=()):
    """Compares the dump with PyTorch's figures and exits 1 on any difference.

    reference: PyTorch's one-rank step-1 gradient (weight then bias, flattened);
    variants: {name: (gradient, clip norm)} in the report's order (variant<i>); broken:
    the names of the variants that must be off the one-rank gradient by more than
    BROKEN_AT_LEAST (the pitfall is there), the others within TOLERANCE of it."""
    failures = list(failures)
    ours_reference, _ = read_safetensors(os.path.join(directory, "reference.safetensors"))
    flat = lambda t: torch.cat([t["grad.weight"].flatten(), t["grad.bias"]])  # noqa: E731
    scale = reference.norm().item()

    def relative(a, b):
        return (a - b).norm().item() / scale

    def compare(name, ours, theirs):
        error = relative(ours, theirs)
        print(f"  {name:40s} gradient error {error:.2e}  {'ok' if error <= TOLERANCE else 'DIFFERS'}")
        if error > TOLERANCE:
            failures.append(f"{name}: gradient differs from PyTorch's by {error:.3g} of the norm")

    compare("one rank", flat(ours_reference), reference)
    for i, (name, (torch_gradient, torch_clip)) in enumerate(variants.items()):
        ours, _ = read_safetensors(os.path.join(directory, f"variant{i}.safetensors"))
        compare(name, flat(ours), torch_gradient)
        off = relative(torch_gradient, reference)
        clip = ours["clip_norm"].item()
        clip_error = abs(clip - torch_clip) / torch_clip
        print(f"  {'':40s} PyTorch's against one rank {off:.3g}; clip norm {clip:.6g} vs PyTorch "
              f"{torch_clip:.6g}  {'ok' if clip_error <= TOLERANCE else 'DIFFERS'}")
        if clip_error > TOLERANCE:
            failures.append(f"{name}: clip norm {clip} differs from PyTorch's {torch_clip}")
        if name in broken and off <= BROKEN_AT_LEAST:
            failures.append(f"{name}: PyTorch's gradient is within {off:.3g} of one rank's; "
                            "the pitfall is not there")
        if name not in broken and off > TOLERANCE:
            failures.append(f"{name}: PyTorch's gradient is {off:.3g} from one rank's")
        if "exact" in name and not torch.equal(flat(ours), flat(ours_reference)):
            failures.append(f"{name}: not bitwise the one-rank gradient")
    if failures:
        print("\n".join(["FAILED:"] + failures))
        sys.exit(1)
    print(f"{scenario}: every variant agrees with PyTorch")


BROKEN = {"shifted-targets": ("shard-local shift, mean, averaged", "shard-local shift, global count")}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    directory = sys.argv[1]
    inputs, ds, repro = load_dump(directory, SCENARIOS)
    scenario = repro["scenario"]
    cfg = {"rows": repro["rows"], "sp": ds["sequence_parallel_size"], "dp": ds["data_parallel_size"],
           "out": repro["out_features"]}
    print(f"{scenario}: sp {cfg['sp']} x dp {cfg['dp']}, {cfg['rows']} rows per replica")
    reference, variants = SCENARIOS[scenario](inputs["x"], inputs["weight"], inputs["bias"], cfg)
    check_variants(directory, scenario, reference, variants, broken=BROKEN.get(scenario, ()))


if __name__ == "__main__":
    main()
