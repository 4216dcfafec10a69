#!/usr/bin/python3
"""Checks seqpar's attention and RoPE against float64 PyTorch.

    SEQPAR_CROSSCHECK_DIR=DIR seqpar_nn_tests "[.torch]"  &&  scripts/crosscheck_attention.py DIR

DIR holds what the tests' [.torch] cases wrote (tests/nn/attention_test.cpp,
tests/nn/rope_test.cpp):
  - attention<n>.safetensors: q, k, v and grad_out [S, H, D] (random shapes, causal or
    not: metadata "causal"), and seqpar's float32 out, grad_q, grad_k and grad_v;
  - rope.safetensors: x and grad_out [S, H, D] at positions first_position + 0..S-1, and
    seqpar's out and grad_x.
PyTorch recomputes each in float64 from the same float32 inputs: softmax(q kᵀ / sqrt(D))
v with keys j > i masked when causal (torch's scaled_dot_product_attention, which
Debian's torch predates, written out), and autograd; RoPE with
θ_m = base^(-2m/D) rounded to float32 (as seqpar's table and torch's usual float32
inv_freq), the angle pos · θ_m and cos/sin in float64, the pairs (m, m + D/2).

Tolerance: every tensor within 1e-5 of its float64 value's largest magnitude (float32
chains of at most a few hundred terms); the figures are printed. Exit status 1 when
anything is beyond it.
"""
import glob
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from crosscheck import read_safetensors  # noqa: E402

TOLERANCE = 1e-5


def relative_error(ours, want):
    scale = want.abs().max().item() or 1.0
    return (ours.double() - want).abs().max().item() / scale


def check_attention(path):
    t, meta = read_safetensors(path)
    causal = meta["causal"] == "1"
    # [S, H, D] -> torch's [H, S, D]
    q, k, v = (t[n].double().transpose(0, 1).requires_grad_() for n in ("q", "k", "v"))
    scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
    if causal:  # key j visible to query i iff j <= i
        hidden = torch.ones(scores.shape[1:], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    out.backward(t["grad_out"].double().transpose(0, 1))
    want = {"out": out.detach(), "grad_q": q.grad, "grad_k": k.grad, "grad_v": v.grad}
    return {name: relative_error(t[name], value.transpose(0, 1)) for name, value in want.items()}


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
