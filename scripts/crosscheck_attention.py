#!/usr/bin/python3
"""Checks seqpar's attention and RoPE against float64 PyTorch.

    SEQPAR_CROSSCHECK_DIR=DIR seqpar_nn_tests "[.torch]"  &&  scripts/crosscheck_attention.py DIR

DIR holds what the tests' [.torch] cases wrote (tests/nn/attention_test.cpp,
tests/nn/rope_test.cpp):
  - attention<n>.safetensors: q and grad_out [B, S, Hq, D], k and v [B, S, Hkv, D]
    (random shapes, grouped-query heads), the mask in the metadata ("causal", packed
    "documents" boundaries, "key_lengths" per sequence, JSON lists) and the "scale",
    and seqpar's float32 out, grad_q, grad_k and grad_v;
  - rope.safetensors: x and grad_out [S, H, D] at positions first_position + 0..S-1, and
    seqpar's out and grad_x.
PyTorch recomputes each in float64 from the same float32 inputs: softmax(scale · q kᵀ) v,
each kv head repeated for its query heads, with the mask built here from its
description (torch's scaled_dot_product_attention, which Debian's torch predates,
written out; a row with no visible key gives 0), and autograd; RoPE with
θ_m = base^(-2m/D) rounded to float32 (as seqpar's table and torch's usual float32
inv_freq), the angle pos · θ_m and cos/sin in float64, the pairs (m, m + D/2).

Tolerance: every tensor within 1e-5 of its float64 value's largest magnitude (float32
chains of at most a few hundred terms); the figures are printed. Exit status 1 when
anything is beyond it.
"""
import glob
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from crosscheck import read_safetensors  # noqa: E402

TOLERANCE = 1e-5


def relative_error(ours, want):
    scale = want.abs().max().item() or 1.0
    return (ours.double() - want).abs().max().item() / scale


def visible_keys(meta, tokens):
    """[B or 1, S, S] booleans: key j visible to query i, from the metadata alone."""
    j = torch.arange(tokens)
    visible = torch.ones(tokens, tokens, dtype=torch.bool)
    if meta["causal"] == "1":
        visible &= j[None, :] <= j[:, None]
    documents = json.loads(meta["documents"])
    if documents:
        doc = torch.bucketize(j, torch.tensor(documents[1:]), right=True)
        visible &= doc[None, :] == doc[:, None]
    visible = visible[None]
    lengths = json.loads(meta["key_lengths"])
    if lengths:
        visible = visible & (j[None, None, :] < torch.tensor(lengths)[:, None, None])
    return visible


def check_attention(path):
    t, meta = read_safetensors(path)
    # [B, S, H, D] -> torch's [B, H, S, D]
    q, k, v = (t[n].double().transpose(1, 2).requires_grad_() for n in ("q", "k", "v"))
    group = q.shape[1] // k.shape[1]
    keys, values = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = float(meta["scale"]) * q @ keys.transpose(2, 3)
    visible = visible_keys(meta, q.shape[2])[:, None]  # [B or 1, 1, S, S]
    scores = scores.masked_fill(~visible, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no visible key: 0
    out = weights @ values
    out.backward(t["grad_out"].double().transpose(1, 2))
    want = {"out": out.detach(), "grad_q": q.grad, "grad_k": k.grad, "grad_v": v.grad}
    return {name: relative_error(t[name], value.transpose(1, 2)) for name, value in want.items()}


def check_rope(path):
    t, meta = read_safetensors(path)
    x = t["x"].double().requires_grad_()
    tokens, _, dim = x.shape
    half = dim // 2
    base = float(meta["base"])
    theta = (base ** (-2.0 * torch.arange(half, dtype=torch.float64) / dim)).float().double()
    positions = int(meta["first_position"]) + torch.arange(tokens, dtype=torch.float64)
    angle = positions[:, None] * theta[None, :]
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    first, second = x[..., :half], x[..., half:]
    out = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
    out.backward(t["grad_out"].double())
    return {"out": relative_error(t["out"], out.detach()), "grad_x": relative_error(t["grad_x"], x.grad)}


def main():
    directory = sys.argv[1]
    paths = sorted(glob.glob(os.path.join(directory, "attention*.safetensors")))
    if not paths or not os.path.exists(os.path.join(directory, "rope.safetensors")):
        print(f"{directory}: no attention*.safetensors or rope.safetensors", file=sys.stderr)
        return 1
    failed = False
    for path, errors in [(p, check_attention(p)) for p in paths] + [
        (os.path.join(directory, "rope.safetensors"), check_rope(os.path.join(directory, "rope.safetensors")))
    ]:
        shape = read_safetensors(path)[0].get("q", read_safetensors(path)[0].get("x")).shape
        line = ", ".join(f"{name} {error:.2e}" for name, error in errors.items())
        bad = any(error > TOLERANCE for error in errors.values())
        failed |= bad
        print(f"{os.path.basename(path)} {list(shape)}: {line}{'  BEYOND ' + str(TOLERANCE) if bad else ''}")
    print("FAILED" if failed else f"all within {TOLERANCE} of float64 PyTorch")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
