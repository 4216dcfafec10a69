#!/usr/bin/python3
"""Recomputes the ulysses scenario's first forward with PyTorch, from the run's dump.

    seqpar-repro --scenario ulysses --dump DIR [...]  &&  scripts/crosscheck_ulysses.py DIR

DIR holds inputs.safetensors (x, target, the block's initial parameters; the
configuration as metadata), reference.safetensors (one rank) and one file per variant
(correct, exact, no-all-to-all, local-positions, local-mask, issue-6868), each with the
step-1 attention output [dp*S, H*D] (the output projection's input) and block output
[dp*S, d_model], rows in one-rank order.

The truth is computed in float64: the block (q, k, v Linears; RoPE "rotate half" with
theta_m = base^(-2m/D); attention; output Linear) with each variant's semantics, the
all-to-all emulated in one process: after it a rank holds every token of its heads, so
Ulysses' attention is per-head attention over the whole sequence, and the exchange
back restores the rows. Then, per variant:
  - seqpar's float32 tensors must match the float64 truth within 1e-4 of the truth's
    largest magnitude (float32 rounding through the block);
  - a mistake's truth must differ from the correct block's by more than 1e-3 of it (the
    mistake is visible), and correct, exact and issue-6868 (whose attention is right)
    must equal the reference dump bit for bit (attention is placement-invariant).
Exit status 1 when anything differs.
"""
import os
import sys
import tomllib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from crosscheck import read_safetensors, rope_float64 as rope  # noqa: E402

TOLERANCE = 1e-4
VISIBLE = 1e-3
RIGHT_ATTENTION = ("correct", "exact", "issue-6868")


def attention(q, k, v, visible):
    """q, k, v [S, H, D]; visible [S, S] bool (query i, key j)."""
    scores = torch.einsum("ihd,jhd->hij", q, k) / q.shape[2] ** 0.5
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hij,jhd->ihd", torch.softmax(scores, dim=2), v)


def block(p, x, variant, cfg):
    """One sequence x [S, d_model] through the block as `variant` computes it."""
    tokens, heads, dim, sp = cfg["rows"], cfg["heads"], cfg["head_dim"], cfg["sp"]
    shard = tokens // sp
    index = torch.arange(tokens)
    positions = index % shard if variant == "local-positions" else index
    causal = index[None, :] <= index[:, None]
    if variant == "no-all-to-all":  # each shard attends over itself: block-diagonal causal
        visible = causal & (index[None, :] // shard == index[:, None] // shard)
    elif variant == "local-mask":  # mask on shard-local indices after the exchange
        visible = (index[None, :] % shard) <= (index[:, None] % shard)
    else:
        visible = causal

    def project(name, rows):
        return torch.nn.functional.linear(rows, p[name + ".weight"], p[name + ".bias"])

    q = rope(project("query", x).reshape(tokens, heads, dim), positions, 10000.0)
    k = rope(project("key", x).reshape(tokens, heads, dim), positions, 10000.0)
    v = project("value", x).reshape(tokens, heads, dim)
    attended = attention(q, k, v, visible).reshape(tokens, heads * dim)
    return attended, project("output", attended)


def truth(p, x, variant, cfg):
    parts = [block(p, x[b * cfg["rows"]:(b + 1) * cfg["rows"]], variant, cfg) for b in range(cfg["dp"])]
    return torch.cat([a for a, _ in parts]), torch.cat([y for _, y in parts])


def main(directory):
    tensors, metadata = read_safetensors(os.path.join(directory, "inputs.safetensors"))
    config = tomllib.loads(metadata["config"])
    repro, ds = config["repro"], config["ds_config"]
    cfg = {"rows": repro["rows"], "heads": repro["heads"], "head_dim": repro["head_dim"],
           "sp": ds["sequence_parallel_size"], "dp": ds["data_parallel_size"]}
    p = {name: value.to(torch.float64) for name, value in tensors.items()}
    reference, _ = read_safetensors(os.path.join(directory, "reference.safetensors"))
    right = truth(p, p["x"], "correct", cfg)
    failures = 0
    for variant in ("reference", "correct", "exact", "no-all-to-all", "local-positions", "local-mask",
                    "issue-6868"):
        dumped, _ = read_safetensors(os.path.join(directory, variant + ".safetensors"))
        expected = right if variant in ("reference",) + RIGHT_ATTENTION else truth(p, p["x"], variant, cfg)
        for index, name in enumerate(("attention", "output")):
            scale = max(1.0, expected[index].abs().max().item())
            error = (dumped[name].to(torch.float64) - expected[index]).abs().max().item() / scale
            ok = error <= TOLERANCE
            line = f"{variant:16} {name:9} max |seqpar - torch float64| / scale = {error:.2e}"
            if variant in RIGHT_ATTENTION:
                same = torch.equal(dumped[name], reference[name])
                ok = ok and same
                line += ", bitwise the one-rank dump" if same else ", NOT bitwise the one-rank dump"
            elif variant != "reference":
                apart = (expected[index] - right[index]).abs().max().item() / scale
                ok = ok and apart > VISIBLE
                line += f"; the mistake moves it by {apart:.2e}"
            print(("ok    " if ok else "FAIL  ") + line)
            failures += not ok
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
