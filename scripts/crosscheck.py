#!/usr/bin/python3
"""Recomputes a seqpar-repro run with PyTorch and compares.

    seqpar-repro --dump DIR [--json FILE] [...]  &&  scripts/crosscheck.py DIR [--json FILE]

Reads DIR/inputs.safetensors (x and the initial weight and bias) and the run's
configuration (stored as TOML in every file's metadata), then replays, with
torch.nn.Linear, torch.optim.AdamW and torch.nn.utils.clip_grad_norm_:
  - the one-rank reference (all rows, mean L1 loss), against DIR/reference.safetensors;
  - every policy that was dumped, rank by rank, with the gradient combination the
    policy prescribes, against DIR/<policy>/rank<R>.safetensors; the exact policy,
    which claims one-rank training's numbers, against the one-rank run.
Parameters must agree to float32 rounding; exit status 1 when any does not.

With --json FILE (the same run's --json), the per-step series are checked too: the
schema's keys and types, one entry per step, every step's losses and gradient norms
against the replay's, and whether the ranks' parameters differ at each step.

The safetensors files are read here with a few lines of NumPy (the format is an
8-byte header length, a JSON header, then raw little-endian data), independently
of seqpar's writer.
"""
import json
import os
import sys
import tomllib

import numpy as np
import torch

# Parameters agree when |seqpar - torch| <= ATOL + RTOL * |torch|: a few float32 ulps
# of weights of size ~0.04, allowing for sums taken in another order.
ATOL, RTOL = 2e-8, 1e-5
# Except where Adam itself amplifies rounding: its step is lr * g / (|g| + eps), so a
# gradient element within a few hundred eps of zero (a sum of signs that cancels up to
# rounding noise) moves its parameter by an amount that depends on that noise. There
# the parameters must agree to lr per step, and are counted as "sensitive".
SENSITIVE_GRADIENT_EPS = 300
GRAD_RTOL = 1e-4  # gradients: relative to the largest gradient element


def read_safetensors(path):
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(length))
        data = f.read()
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, entry in header.items():
        assert entry["dtype"] == "F32", f"{path}: {name} is {entry['dtype']}, expected F32"
        begin, end = entry["data_offsets"]
        values = np.frombuffer(data[begin:end], dtype="<f4").reshape(entry["shape"])
        tensors[name] = torch.from_numpy(values.copy())
    return tensors, metadata



def write_safetensors(tensors, path):
    """safetensors' format: bf16 tensors stay bf16 (dtype BF16), the rest are float32."""
    header, offset, blobs = {}, 0, []
    for name, tensor in tensors.items():
        tensor = tensor.detach().contiguous()
        if tensor.dtype == torch.bfloat16:
            data, dtype = tensor.view(torch.int16).numpy().tobytes(), "BF16"
        else:
            data, dtype = tensor.to(torch.float32).numpy().tobytes(), "F32"
        header[name] = {"dtype": dtype, "shape": list(tensor.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def rope_float64(x, positions, base=10000.0):
    """x [S, H, D]; pairs (m, m + D/2) rotated by positions * base^(-2m/D), in float64."""
    half = x.shape[2] // 2
    theta = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / x.shape[2])
    angle = positions.to(torch.float64)[:, None] * theta[None, :]
    cos, sin = torch.cos(angle)[:, None, :], torch.sin(angle)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=2)

def train(rows_per_rank, weight, bias, reduction_divisors, combine, config):
    """Trains one Linear per rank; `combine` maps the list of per-rank gradient lists
    to the gradients each rank uses. Returns per-rank (weight, bias, grad_w, grad_b)."""
    ds, repro = config["ds_config"], config["repro"]
    params = ds["optimizer"]["params"]
    models, optimizers = [], []
    for _ in rows_per_rank:
        model = torch.nn.Linear(repro["in_features"], repro["out_features"])
        with torch.no_grad():
            model.weight.copy_(weight)
            model.bias.copy_(bias)
        models.append(model)
        optimizers.append(torch.optim.AdamW(model.parameters(), lr=params["lr"],
                                            betas=tuple(params["betas"]), eps=params["eps"],
                                            weight_decay=params["weight_decay"]))
    out = repro["out_features"]
    smallest = [[torch.full_like(weight, float("inf")), torch.full_like(bias, float("inf"))]
                for _ in rows_per_rank]
    history = {"losses": [], "norms": [], "ranks_differ": []}  # [step][rank], [step]
    for _ in range(repro["steps"]):
        gradients, losses, norms = [], [], []
        for model, x, divisor in zip(models, rows_per_rank, reduction_divisors):
            model.zero_grad()
            error = (x[:, :out] - model(x)).abs()
            loss = error.mean() if divisor is None else error.sum() / divisor
            loss.backward()
            losses.append(float(loss))
            gradients.append([model.weight.grad.clone(), model.bias.grad.clone()])
        for model, optimizer, used, small in zip(models, optimizers, combine(gradients), smallest):
            model.weight.grad, model.bias.grad = used[0].clone(), used[1].clone()
            for i in range(2):
                small[i] = torch.minimum(small[i], used[i].abs())
            norms.append(float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in used]))))
            if ds["gradient_clipping"] > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), ds["gradient_clipping"])
            optimizer.step()
        history["losses"].append(losses)
        history["norms"].append(norms)
        history["ranks_differ"].append(any(
            not (torch.equal(m.weight, models[0].weight) and torch.equal(m.bias, models[0].bias))
            for m in models[1:]))
    return [(m.weight.detach(), m.bias.detach(), m.weight.grad, m.bias.grad, small)
            for m, small in zip(models, smallest)], history


def policy_setup(policy, x, config):
    """Rows, loss divisors and gradient combination of each world rank for a policy."""
    ds, repro = config["ds_config"], config["repro"]
    sp, dp, rows, out = (ds["sequence_parallel_size"], ds["data_parallel_size"], repro["rows"],
                         repro["out_features"])
    world = sp * dp
    shards, divisors = [], []
    for rank in range(world):
        batch = x[(rank // sp) * rows:(rank // sp + 1) * rows]
        split = torch.tensor_split if policy == "exact" else torch.chunk
        shard = split(batch, sp, dim=0)[rank % sp]
        shards.append(shard)
        divisors.append(dp * rows * out if policy == "exact" else None)  # None: the script's .mean()

    def total(gradients, ranks):
        return [sum(gradients[r][i] for r in ranks) for i in range(2)]

    def combine(gradients):
        used = []
        for rank in range(world):
            dp_group = [rank % sp + j * sp for j in range(dp)]
            if policy == "deepspeed-0.16":
                used.append([g * (sp / dp) for g in total(gradients, dp_group)])
            elif policy == "with-mpu":
                used.append([g / dp for g in total(gradients, range(world))])
            else:  # exact: each rank's share of the global mean, summed over sp x dp
                used.append(total(gradients, range(world)))
        return used

    return shards, divisors, combine


def compare(label, ours, theirs, config):
    """Returns the failures (empty list when everything agrees) and the number of
    Adam-sensitive elements."""
    params = config["ds_config"]["optimizer"]["params"]
    lr_budget = params["lr"] * config["repro"]["steps"]
    failures, sensitive_count = [], 0
    for name, expected, smallest in zip(["weight", "bias"], theirs[:2], theirs[4]):
        got = ours[name]
        difference = (got - expected).abs()
        sensitive = smallest < SENSITIVE_GRADIENT_EPS * params["eps"]
        bad = torch.where(sensitive, difference > lr_budget,
                          difference > ATOL + RTOL * expected.abs())
        sensitive_count += int((sensitive & (difference > ATOL + RTOL * expected.abs())).sum())
        if bad.any():
            failures.append(f"{label}: {name}: {int(bad.sum())} elements differ, max "
                            f"{float((got - expected).abs().max()):.3g}")
    for name, expected in zip(["grad.weight", "grad.bias"], theirs[2:]):
        scale = float(expected.abs().max()) or 1.0
        error = float((ours[name] - expected).abs().max()) / scale
        if error > GRAD_RTOL:
            failures.append(f"{label}: {name}: relative difference {error:.3g}")
    return failures, sensitive_count


def close(a, b, rtol):
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-30)


def check_json(path, config, reference_history, histories):
    """The --json file's schema and per-step series against the replay's. Returns the
    failures. Losses and norms are float32 sums taken in another order: they agree to a
    relative 1e-5 (the norms of the exact policy, whose gradients are the reference's,
    as well)."""
    with open(path) as f:
        report = json.load(f)
    failures = []

    def expect(condition, message):
        if not condition:
            failures.append(f"{path}: {message}")
        return condition

    ds, repro = config["ds_config"], config["repro"]
    steps, sp, dp = repro["steps"], ds["sequence_parallel_size"], ds["data_parallel_size"]
    expect(report.get("schema") == "seqpar-repro/4", f"schema {report.get('schema')!r}")
    for key, value in [("steps", steps), ("sequence_parallel_size", sp),
                       ("data_parallel_size", dp), ("world_size", sp * dp),
                       ("rows", repro["rows"])]:
        expect(report.get(key) == value, f"{key} is {report.get(key)!r}, the dump says {value}")
    expect(len(report.get("initial_parameter_fingerprints", [])) == sp * dp,
           "one initial fingerprint per rank")
    baseline = report.get("baseline", {})
    for name, series in [("losses", "losses"), ("gradient_norms", "norms")]:
        got = baseline.get(name, [])
        if expect(len(got) == steps, f"baseline.{name} has {len(got)} entries for {steps} steps"):
            for step, (a, b) in enumerate(zip(got, reference_history[series])):
                expect(close(a, b[0], 1e-5), f"baseline.{name}[{step}] {a} vs PyTorch {b[0]}")

    for policy in report.get("policies", []):
        name = policy.get("name")
        if "skipped" in policy:
            continue
        expect(isinstance(policy.get("verdict"), str) and policy.get("verdict_text"),
               f"{name}: verdict and verdict_text")
        expect(0 <= policy.get("first_broken_step", -1) <= steps,
               f"{name}: first_broken_step {policy.get('first_broken_step')!r}")
        series = policy.get("steps", [])
        if not expect(len(series) == steps, f"{name}: {len(series)} step entries for {steps} steps"):
            continue
        history = histories.get(name, "not dumped")
        for step, entry in enumerate(series):
            where = f"{name} step {step + 1}"
            expect(entry.get("step") == step + 1, f"{where}: numbered {entry.get('step')!r}")
            for key in ["loss_per_rank", "local_gradient_norm_per_rank", "used_gradient_norm_per_rank"]:
                expect(len(entry.get(key, [])) == sp * dp, f"{where}: {key} has one entry per rank")
            expect(close(entry["baseline_loss"], reference_history["losses"][step][0], 1e-5),
                   f"{where}: baseline_loss")
            differ = entry.get("differing_parameters", -1) > 0
            if history == "not dumped":
                continue
            if history is None:  # exact: the ranks' shares add up to the one-rank loss
                expect(not differ, f"{where}: the exact policy's ranks differ")
                expect(close(sum(entry["loss_per_rank"]), reference_history["losses"][step][0], 1e-5),
                       f"{where}: the ranks' loss shares sum to {sum(entry['loss_per_rank'])}, "
                       f"the one-rank loss is {reference_history['losses'][step][0]}")
                for rank, norm in enumerate(entry["used_gradient_norm_per_rank"]):
                    expect(close(norm, reference_history["norms"][step][0], 1e-5),
                           f"{where}: rank {rank}'s gradient norm {norm}")
                continue
            expect(differ == history["ranks_differ"][step],
                   f"{where}: seqpar's ranks {'differ' if differ else 'agree'}, PyTorch's "
                   f"{'differ' if history['ranks_differ'][step] else 'agree'}")
            for rank in range(sp * dp):
                for key, replayed, rtol in [("loss_per_rank", history["losses"], 1e-5),
                                            ("used_gradient_norm_per_rank", history["norms"], 1e-4)]:
                    a, b = entry[key][rank], replayed[step][rank]
                    expect(close(a, b, rtol), f"{where}: {key}[{rank}] {a} vs PyTorch {b}")
    return failures


def main(directory, json_path=None):
    inputs, metadata = read_safetensors(os.path.join(directory, "inputs.safetensors"))
    config = tomllib.loads(metadata["config"])
    x = inputs["x"]
    torch.manual_seed(0)  # Linear's own init is overwritten; seed only for tidiness
    failures = []

    [reference], reference_history = train([x], inputs["weight"], inputs["bias"], [None],
                                           lambda g: g, config)
    ours, _ = read_safetensors(os.path.join(directory, "reference.safetensors"))
    failures, sensitive = compare("reference", ours, reference, config)
    checked = ["reference"]
    histories = {}

    for policy in ["deepspeed-0.16", "with-mpu", "exact"]:
        folder = os.path.join(directory, policy)
        if not os.path.isdir(folder):
            continue
        shards, divisors, combine = policy_setup(policy, x, config)
        if policy == "exact":
            # exact claims one-rank training's numbers: it is held to PyTorch's one-rank
            # run. (PyTorch's own per-rank replay would not do: its GEMM sums a row in an
            # order that depends on the batch, so a shard's residuals can round, and
            # sign(), differently from the full batch's.)
            results = [reference] * len(shards)
            histories[policy] = None
        else:
            results, histories[policy] = train(shards, inputs["weight"], inputs["bias"], divisors,
                                               combine, config)
        for rank, theirs in enumerate(results):
            ours, _ = read_safetensors(os.path.join(folder, f"rank{rank}.safetensors"))
            more, more_sensitive = compare(f"{policy} rank {rank}", ours, theirs, config)
            failures += more
            sensitive += more_sensitive
        checked.append(f"{policy} ({len(results)} ranks)")

    if json_path is not None:
        failures += check_json(json_path, config, reference_history, histories)
        checked.append(f"the per-step series of {json_path}")

    print(f"crosscheck: PyTorch {torch.__version__} recomputed {', '.join(checked)}")
    if sensitive:
        print(f"crosscheck: {sensitive} parameter(s) with a gradient within "
              f"{SENSITIVE_GRADIENT_EPS} eps of zero agree to lr, not to rounding "
              "(Adam's step amplifies the rounding of such gradients)")
    for failure in failures:
        print("  MISMATCH", failure)
    print("crosscheck:", "FAILED" if failures else "seqpar and PyTorch agree")
    return 1 if failures else 0


if __name__ == "__main__":
    arguments = sys.argv[1:]
    json_argument = None
    if len(arguments) == 3 and arguments[1] == "--json":
        json_argument = arguments[2]
        arguments = arguments[:1]
    if len(arguments) != 1:
        sys.exit(__doc__)
    sys.exit(main(arguments[0], json_argument))
