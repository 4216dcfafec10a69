#!/usr/bin/python3
"""Recomputes the context-parallel scenario's first forward and step-1 gradients with
PyTorch, from the run's dump.

    seqpar-repro --scenario context-parallel --dump DIR [...]  &&  scripts/crosscheck_context_parallel.py DIR

DIR holds inputs.safetensors (x, target, the block's initial parameters; the
configuration as metadata), reference.safetensors (one rank) and one file per variant,
each with the step-1 block output [S, d_model] (rows in position order) and grad.* (the
gradient summed over the ranks at step 1, before clipping).

The truth is computed in float64, the ranks emulated in one process: the block (q, k, v
Linears; RoPE "rotate half" at each token's position; causal attention; output Linear;
L1 loss over S * d_model) by autograd, except attention's backward, which is written
out block by block as a ring runs it: rank r's queries against rank b's keys (zigzag
shards), with the softmax's row log-sum-exp of the forward:

    P = exp(c q_r K_b^T - lse_r)   dS = P * (g_r V_b^T - delta_r)
    dq_r += c dS K_b               dK_b += c dS^T q_r   dV_b += P^T g_r   (sent to rank b)

Each variant's mistake is a change to that: stale K/V uses rank b+1's K, V in block b's
place; dK/dV not reduced keeps only r = b's partial; the loss per rank divides by S/sp *
d_model; unpermuted positions rotate rank r's i-th row at r * S/sp + i. Then:
  - seqpar's float32 output and gradients must match the float64 truth within 1e-4 of
    the truth's largest magnitude;
  - a mistake's truth must differ from one rank's by more than 1e-3 of it;
  - the exact variants must equal the one-rank dump bit for bit.
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
EXACT = ("contiguous", "zigzag", "usp", "head-wall")
VARIANTS = EXACT + ("ring", "stale-kv", "dkv-not-reduced", "loss-per-rank", "unpermuted-positions")
# What each mistake moves away from one rank's (the rest it leaves as one rank's).
MOVES = {"stale-kv": ("gradients",), "dkv-not-reduced": ("gradients",), "loss-per-rank": ("gradients",),
         "unpermuted-positions": ("output", "gradients")}
PARAMETERS = [f"{m}.{f}" for m in ("query", "key", "value", "output") for f in ("weight", "bias")]


def zigzag(tokens, ranks):
    """Every rank's positions: chunks r and 2C-1-r of 2C."""
    chunk = tokens // (2 * ranks)
    return [torch.cat([torch.arange(r * chunk, (r + 1) * chunk),
                       torch.arange((2 * ranks - 1 - r) * chunk, (2 * ranks - r) * chunk)]) for r in range(ranks)]


def attention_backward(q, k, v, out, lse, g, shards, variant):
    """dq, dk, dv of causal attention, block by block over the ranks' shards."""
    c = q.shape[2] ** -0.5
    delta = (g * out).sum(dim=2)  # [S, H]
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    ranks = len(shards)
    for r, rows in enumerate(shards):
        for b, cols in enumerate(shards):
            held = shards[(b + 1) % ranks] if variant == "stale-kv" else cols
            visible = cols[None, :] <= rows[:, None]  # the mask of block b's positions
            p = torch.exp(c * torch.einsum("ihd,jhd->hij", q[rows], k[held]) - lse[rows].T[:, :, None])
            p = p.masked_fill(~visible[None], 0.0)
            ds = p * (torch.einsum("ihd,jhd->hij", g[rows], v[held]) - delta[rows].T[:, :, None])
            dq[rows] += c * torch.einsum("hij,jhd->ihd", ds, k[held])
            if variant == "dkv-not-reduced" and r != b:
                continue  # rank r's partial for rank b's keys never reaches rank b
            dk[cols] += c * torch.einsum("hij,ihd->jhd", ds, q[rows])
            dv[cols] += torch.einsum("hij,ihd->jhd", p, g[rows])
    return dq, dk, dv


def truth(inputs, variant, cfg):
    """The step-1 output [S, d_model] and gradients of `variant`, in float64."""
    tokens, heads, dim, sp = cfg["rows"], cfg["heads"], cfg["head_dim"], cfg["sp"]
    p = {name: inputs[name].to(torch.float64).requires_grad_() for name in PARAMETERS}
    x, target = inputs["x"].to(torch.float64), inputs["target"].to(torch.float64)
    shards = zigzag(tokens, sp)
    positions = torch.arange(tokens)
    if variant == "unpermuted-positions":  # rank r's i-th row rotated at r * S/sp + i
        for r, rows in enumerate(shards):
            positions[rows] = r * len(rows) + torch.arange(len(rows))

    def project(name, rows):
        return torch.nn.functional.linear(rows, p[name + ".weight"], p[name + ".bias"])

    q = rope(project("query", x).reshape(tokens, heads, dim), positions)
    k = rope(project("key", x).reshape(tokens, heads, dim), positions)
    v = project("value", x).reshape(tokens, heads, dim)
    index = torch.arange(tokens)
    scores = torch.einsum("ihd,jhd->hij", q, k) / dim ** 0.5
    scores = scores.masked_fill(~(index[None, :] <= index[:, None])[None], float("-inf"))
    lse = torch.logsumexp(scores, dim=2).T.detach()  # [S, H]
    out = torch.einsum("hij,jhd->ihd", torch.softmax(scores, dim=2), v).detach().requires_grad_()
    y = project("output", out.reshape(tokens, heads * dim))
    count = (tokens // sp if variant == "loss-per-rank" else tokens) * x.shape[1]
    ((y - target).abs().sum() / count).backward()
    dq, dk, dv = attention_backward(q.detach(), k.detach(), v.detach(), out.detach(), lse, out.grad, shards, variant)
    torch.autograd.backward([q, k, v], [dq, dk, dv])
    return y.detach(), {name: p[name].grad for name in PARAMETERS}


def main(directory):
    inputs, metadata = read_safetensors(os.path.join(directory, "inputs.safetensors"))
    config = tomllib.loads(metadata["config"])
    repro, ds = config["repro"], config["ds_config"]
    cfg = {"rows": repro["rows"], "heads": repro["heads"], "head_dim": repro["head_dim"],
           "sp": ds["sequence_parallel_size"]}
    reference, _ = read_safetensors(os.path.join(directory, "reference.safetensors"))
    right = truth(inputs, "reference", cfg)
    failures = 0
    for variant in ("reference",) + VARIANTS:
        dumped, _ = read_safetensors(os.path.join(directory, variant + ".safetensors"))
        expected = right if variant in ("reference", "ring") + EXACT else truth(inputs, variant, cfg)
        checks = [("output", expected[0], right[0])]
        grads = torch.cat([g.flatten() for g in expected[1].values()])
        checks.append(("gradients", grads, torch.cat([g.flatten() for g in right[1].values()])))
        dumped_grads = torch.cat([dumped["grad." + name].flatten() for name in PARAMETERS])
        for name, value, one_rank in checks:
            seqpar = dumped["output"] if name == "output" else dumped_grads
            scale = value.abs().max().item()
            error = (seqpar.to(torch.float64) - value).abs().max().item() / scale
            ok = error <= TOLERANCE
            line = f"{variant:21} {name:9} max |seqpar - torch float64| / scale = {error:.2e}"
            if variant in EXACT:
                mine = dumped["output"] if name == "output" else dumped_grads
                ref = reference["output"] if name == "output" else torch.cat(
                    [reference["grad." + n].flatten() for n in PARAMETERS])
                same = torch.equal(mine, ref)
                ok = ok and same
                line += ", bitwise the one-rank dump" if same else ", NOT bitwise the one-rank dump"
            elif name in MOVES.get(variant, ()):
                apart = (value - one_rank).abs().max().item() / scale
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
