#!/usr/bin/python3
"""Recomputes the masked-tokens scenario's step-1 gradients with PyTorch, from the dump.

    seqpar-repro --config configs/masked-tokens.toml --dump DIR [...]  &&  scripts/crosscheck_masked_tokens.py DIR

DIR is what the scenario's --dump wrote: inputs.safetensors (x, the initial weight and
bias, the row mask; the configuration as metadata), reference.safetensors and
variant<i>.safetensors, each with rank 0's combined gradient at step 1 (grad.weight,
grad.bias) and the norm the step clipped with (clip_norm).

This script plays every sp x dp rank in one process, as the trainer would run it: each
rank's share of each micro-batch (the micro-batch rule of apps/repro/masked_tokens.h,
the ranks' rows split by torch.tensor_split), the ignored rows dropped as
cross-entropy's ignore_index drops them (boolean indexing, then torch's own
l1_loss), backward per micro-batch with the gradients accumulating in float32 on the
rank's model, then the ranks' gradients combined:
  - "per-micro-batch mean, averaged": l1_loss(mean) over the part's valid rows / ga,
    averaged over the ranks (DDP);
  - "per-rank count, averaged": the part's sum / (the rank's valid rows of the step x
    out), averaged over the ranks;
  - "global count (num_items_in_batch)" and "global count, exact sums": the part's sum /
    (every rank's valid rows x out), summed over the ranks.
The one-rank reference is l1_loss(mean) over every valid row at once. Then:
  - every combined gradient must match the dump's to 1e-5 of the one-rank norm, and its
    norm the dump's clip norm to relative 1e-5;
  - the broken variants must differ from PyTorch's one-rank gradient by more than 1e-3
    (the pitfall is there, in PyTorch too), the global count by less than 1e-5;
  - the exact variant's gradient must equal the dump's one-rank gradient bit for bit.
Exit status 1 when anything differs.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from crosscheck_pitfall import check_variants, load_dump  # noqa: E402


def micro_batches(rows, ga):
    """(first, count) of micro-batch k: a share (k + 1) / (1 + ... + ga), the last the rest."""
    shares = ga * (ga + 1) // 2
    batches, first = [], 0
    for k in range(ga):
        count = rows * (k + 1) // shares if k + 1 < ga else rows - first
        batches.append((first, count))
        first += count
    return batches


def rank_parts(x, mask, cfg):
    """parts[(d, r)]: the (x rows, mask rows) of rank (sp r, dp d) for each micro-batch."""
    rows, sp, dp, ga = cfg["rows"], cfg["sp"], cfg["dp"], cfg["ga"]
    parts = {(d, r): [] for d in range(dp) for r in range(sp)}
    for d in range(dp):
        for first, count in micro_batches(rows, ga):
            begin = d * rows + first
            xs = torch.tensor_split(x[begin:begin + count], sp)
            ms = torch.tensor_split(mask[begin:begin + count], sp)
            for r in range(sp):
                parts[(d, r)].append((xs[r], ms[r]))
    return parts


def model_like(weight, bias):
    model = torch.nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        model.weight.copy_(weight)
        model.bias.copy_(bias)
    return model


def flat_grad(model):
    return torch.cat([model.weight.grad.flatten(), model.bias.grad]).clone()


def valid_rows(x_rows, mask_rows, out):
    keep = mask_rows != 0
    return x_rows[keep], x_rows[keep, :out]


def rank_gradient(weight, bias, parts, out, loss_of):
    """One rank's accumulated gradient: loss_of(y_valid, t_valid) per micro-batch."""
    model = model_like(weight, bias)
    for x_rows, mask_rows in parts:
        inputs, targets = valid_rows(x_rows, mask_rows, out)
        loss_of(model(inputs), targets).backward()
    return flat_grad(model)


def recompute(x, weight, bias, mask, cfg):
    out, ga = cfg["out"], cfg["ga"]
    reference_model = model_like(weight, bias)
    inputs, targets = valid_rows(x, mask, out)
    torch.nn.functional.l1_loss(reference_model(inputs), targets).backward()
    reference = flat_grad(reference_model)

    parts = rank_parts(x, mask, cfg)
    for rank, rank_parts_ in parts.items():
        for _, mask_rows in rank_parts_:
            assert (mask_rows != 0).any(), f"rank {rank}: a micro-batch part without a valid row"
    global_valid = int(sum((m != 0).sum().item() for ps in parts.values() for _, m in ps))
    assert global_valid == int((mask != 0).sum().item())

    def per_micro_batch_mean(rank_parts_):
        return lambda y, t: torch.nn.functional.l1_loss(y, t) / ga

    def per_rank_count(rank_parts_):
        count = sum(int((m != 0).sum().item()) for _, m in rank_parts_) * out
        return lambda y, t: torch.nn.functional.l1_loss(y, t, reduction="sum") / count

    def global_count(rank_parts_):
        return lambda y, t: torch.nn.functional.l1_loss(y, t, reduction="sum") / (global_valid * out)

    def gradients(convention):
        return [rank_gradient(weight, bias, ps, out, convention(ps)) for ps in parts.values()]

    average = lambda gs: sum(gs) / len(gs)  # noqa: E731
    variants = {
        "per-micro-batch mean, averaged": average(gradients(per_micro_batch_mean)),
        "per-rank count, averaged": average(gradients(per_rank_count)),
        "global count (num_items_in_batch)": sum(gradients(global_count)),
        "global count, exact sums": sum(gradients(global_count)),
    }
    return reference, variants


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    directory = sys.argv[1]
    inputs, ds, repro = load_dump(directory, ("masked-tokens",))
    cfg = {"rows": repro["rows"], "sp": ds["sequence_parallel_size"], "dp": ds["data_parallel_size"],
           "out": repro["out_features"], "ga": ds["gradient_accumulation_steps"]}
    mask = inputs["mask"]
    assert mask.shape == (cfg["dp"] * cfg["rows"],), f"mask of shape {tuple(mask.shape)}"
    assert bool(((mask == 0) | (mask == 1)).all()), "the mask holds values other than 0 and 1"
    reference, variants = recompute(inputs["x"], inputs["weight"], inputs["bias"], mask, cfg)
    ignored = int((mask == 0).sum().item())
    print(f"masked-tokens: sp {cfg['sp']} x dp {cfg['dp']}, {cfg['rows']} rows per replica, "
          f"{cfg['ga']} micro-batch(es), {ignored} of {mask.numel()} rows ignored")
    check_variants(directory, "masked-tokens", reference,
                   {name: (g, g.norm().item()) for name, g in variants.items()},
                   broken=[name for name in variants if name.startswith("per-")])


if __name__ == "__main__":
    main()
