#!/usr/bin/python3
"""A DeepSpeed-Ulysses attention layer emulated in PyTorch, saved as a user saves it, and
what seqpar-diagnose says about it.

    scripts/diagnose_torch_ulysses.py path/to/seqpar-diagnose WORK_DIR

The layer: q, k, v = x Wq, x Wk, x Wv (H heads of D), causal softmax attention with
scale 1/sqrt(D), out = o Wo, the mean squared error against a target, one AdamW step on
float32 master weights. The sp = 4 ranks each project their S/4 tokens; the first
all-to-all gives each rank every token of H/4 heads, the second gives each its tokens of
every head back (emulated in one process by concatenating and slicing, in rank order).
Each rank saves its parameters after the step, grad.* (the reduced gradient) and its
attention output (`attention`, its tokens), with attention.query and attention.key; one
process on the whole sequence is the baseline. The runs:

  correct, bf16     the ranks' attention a bf16 kernel of another op order (scores and
                    softmax in bf16, per head shard), the baseline's computed in float32
                    and rounded to bf16: they differ only by bf16's rounding. Must not be
                    called wrong: no WRONG verdict, no cause.
  correct, bf16 saved as float32, with ds_config's "bf16": {"enabled": true}: the same.
  correct, fp32     the same kernels in float32: CONSISTENT, NOT EXACT.
  wrong scale       1/D instead of 1/sqrt(D) on the ranks: the attention differs on the
                    first shard; no cause may tell to fix the causal mask (no fix is
                    printed: the evidence cannot tell a scale from a mask).
  heads reordered   the second all-to-all puts the heads back in reversed rank order:
                    "heads in the wrong order", with its fix, never the mask's.
  layouts           the correct bf16 run's attention saved batch first [b, S/sp, H*D],
                    DeepSpeed's [s, b, h, d], head-sharded inside the all-to-all
                    [S, H/sp*D]: each read, and matching; [S, H/sp, D] (also [b, S/sp, h*d]'s
                    shape) refused with the --attention-layout hint, then read with it.

Exit status 1 when any check fails, 77 when PyTorch is not installed.
"""
import json
import math
import os
import subprocess
import sys

try:
    import torch
except ImportError:
    print("skipped: PyTorch is not installed")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from crosscheck import write_safetensors  # noqa: E402

SP, S, H, D, MODEL = 4, 256, 8, 16, 64
LR = 1e-3


def attend_float32(q, k, v, scale, dtype):
    """[S, h, D] each: one kernel, in float32 whatever the inputs, rounded to `dtype`."""
    scores = torch.einsum("shd,thd->hst", q.float(), k.float()) * scale
    mask = torch.ones(q.shape[0], q.shape[0], dtype=torch.bool).tril()
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.einsum("hst,thd->shd", weights, v.float()).to(dtype)


def attend_in_dtype(q, k, v, scale, dtype):
    """Another kernel: scores, softmax and weighted sum in `dtype`, one head at a time."""
    mask = torch.ones(q.shape[0], q.shape[0], dtype=torch.bool).tril()
    heads = []
    for h in range(q.shape[1]):
        scores = (q[:, h] @ k[:, h].T) * scale
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        heads.append((weights @ v[:, h]).unsqueeze(1))
    return torch.cat(heads, dim=1)


def initial_state():
    generator = torch.Generator().manual_seed(2026)
    weights = {name: torch.randn(rows, cols, generator=generator) / math.sqrt(cols)
               for name, rows, cols in [("wq", H * D, MODEL), ("wk", H * D, MODEL), ("wv", H * D, MODEL),
                                        ("wo", MODEL, H * D)]}
    x = torch.randn(S, MODEL, generator=generator)
    target = torch.randn(S, MODEL, generator=generator)
    return weights, x, target


def step(master, x, target, dtype, forward):
    """forward(params, x) -> (out, attention, q, k); one AdamW step on float32 masters."""
    params = {n: w.detach().to(dtype).clone().requires_grad_() for n, w in master.items()}
    out, attention, q, k = forward(params, x.to(dtype))
    loss = ((out.float() - target) ** 2).sum() / out.numel()
    loss.backward()
    grads = {n: p.grad for n, p in params.items()}
    masters = {n: w.detach().clone().requires_grad_() for n, w in master.items()}
    optimizer = torch.optim.AdamW(list(masters.values()), lr=LR, weight_decay=0.0)
    for n, w in masters.items():
        w.grad = grads[n].float()
    optimizer.step()
    return {n: w.detach() for n, w in masters.items()}, grads, attention, q, k


def one_rank(params, x):
    q, k, v = [(x @ params[n].T).view(S, H, D) for n in ("wq", "wk", "wv")]
    o = attend_float32(q, k, v, 1 / math.sqrt(D), x.dtype)
    return o.reshape(S, H * D) @ params["wo"].T, o.reshape(S, H * D), q, k


def ulysses(scale, reorder_heads):
    """The sp ranks' forward, all of them: each projects its tokens, the all-to-alls
    exchange heads for tokens and back (emulated by concatenation in rank order)."""
    def forward(params, x):
        shard, group = S // SP, H // SP
        per_rank = [[(x[r * shard:(r + 1) * shard] @ params[n].T).view(shard, H, D) for n in ("wq", "wk", "wv")]
                    for r in range(SP)]
        q, k, v = [torch.cat([per_rank[r][i] for r in range(SP)]) for i in range(3)]  # [S, H, D]
        # First all-to-all: rank r holds every token of heads r*H/sp .. (r+1)*H/sp - 1.
        by_heads = [attend_in_dtype(q[:, r * group:(r + 1) * group], k[:, r * group:(r + 1) * group],
                                    v[:, r * group:(r + 1) * group], scale, x.dtype) for r in range(SP)]
        # Second all-to-all: each rank's tokens, the heads in source-rank order (or reversed).
        order = list(reversed(range(SP))) if reorder_heads else list(range(SP))
        o = torch.cat([by_heads[r] for r in order], dim=1).reshape(S, H * D)
        return o @ params["wo"].T, o, q, k
    return forward


def save_run(folder, run, sp_ranks, layout="tokens-first"):
    """sp_ranks: save each rank's share (and the attention in `layout`); else the baseline."""
    os.makedirs(folder, exist_ok=True)
    master, grads, attention, q, k = run
    common = {**master, **{"grad." + n: g for n, g in grads.items()}}
    if not sp_ranks:
        saved = {"tokens-first": attention, "batch-first": attention.unsqueeze(0),
                 "sbhd": attention.view(S, 1, H, D), "head-sharded": attention,
                 "head-sharded-3d": attention.view(S, H, D)}[layout]
        write_safetensors({**common, "attention": saved, "attention.query": q.reshape(S, H * D),
                   "attention.key": k.reshape(S, H * D)}, os.path.join(folder, "baseline.safetensors"))
        return
    shard, width = S // SP, H * D // SP
    for r in range(SP):
        rows = slice(r * shard, (r + 1) * shard)
        mine = {"tokens-first": attention[rows], "batch-first": attention[rows].unsqueeze(0),
                "sbhd": attention[rows].view(shard, 1, H, D),
                "head-sharded": attention[:, r * width:(r + 1) * width],
                "head-sharded-3d": attention.view(S, H, D)[:, r * H // SP:(r + 1) * H // SP]}[layout]
        write_safetensors({**common, "attention": mine, "attention.query": q[rows].reshape(shard, H * D),
                   "attention.key": k[rows].reshape(shard, H * D)},
                  os.path.join(folder, f"model_rank{r}.safetensors"))


def diagnose(program, folder, *extra):
    command = [program, "--ranks", os.path.join(folder, "model_rank*.safetensors"),
               "--baseline", os.path.join(folder, "baseline.safetensors"), "--lr", str(LR), "--betas", "0.9,0.999",
               "--json", os.path.join(folder, "diagnosis.json"), *extra]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        return None, run.stdout + run.stderr
    with open(os.path.join(folder, "diagnosis.json")) as f:
        return json.load(f), run.stdout


def no_mask_fix(result):
    return all("mask" not in (cause["fix"] or "") for cause in result["causes"])


def main():
    program, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    torch.manual_seed(0)
    master, x, target = initial_state()
    sqrt_scale = 1 / math.sqrt(D)
    runs = {}
    for dtype, tag in [(torch.bfloat16, "bf16"), (torch.float32, "fp32")]:
        runs["baseline-" + tag] = step(master, x, target, dtype, one_rank)
        runs["correct-" + tag] = step(master, x, target, dtype, ulysses(sqrt_scale, False))
    runs["wrong-scale"] = step(master, x, target, torch.bfloat16, ulysses(1 / D, False))
    runs["heads-reordered"] = step(master, x, target, torch.bfloat16, ulysses(sqrt_scale, True))

    def case(name, ranks, baseline, layout="tokens-first", as_float32=False):
        folder = os.path.join(work, name)
        convert = (lambda run: tuple({n: t.float() for n, t in part.items()} if isinstance(part, dict)
                                     else part.float() for part in run)) if as_float32 else (lambda run: run)
        save_run(folder, convert(runs[ranks]), True, layout)
        save_run(folder, convert(runs[baseline]), False, layout)
        return folder

    os.makedirs(work, exist_ok=True)
    ds_config = os.path.join(work, "ds_config_bf16.json")
    with open(ds_config, "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                   "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}}}, f)
    checks = [
        ("correct bf16", case("correct-bf16", "correct-bf16", "baseline-bf16"), [], [
            ("not called wrong", lambda r: "WRONG" not in r["verdict"] and "UNLIKE" not in r["verdict"]),
            ("no cause", lambda r: not r["causes"]),
            ("attention matches", lambda r: r["attention"]["signature"] == "matches"),
            ("precision bf16", lambda r: r["attention"]["precision"] == "bf16")]),
        ("correct bf16 saved as float32, ds_config bf16",
         case("correct-bf16-f32", "correct-bf16", "baseline-bf16", as_float32=True), ["--ds-config", ds_config], [
            ("not called wrong", lambda r: "WRONG" not in r["verdict"] and "UNLIKE" not in r["verdict"]),
            ("precision from the config", lambda r: any("precision bf16" in s for s in r["settings"]))]),
        ("correct fp32", case("correct-fp32", "correct-fp32", "baseline-fp32"), [], [
            ("CONSISTENT, NOT EXACT", lambda r: r["verdict"] == "CONSISTENT, NOT EXACT"),
            ("attention matches", lambda r: r["attention"]["signature"] == "matches")]),
        ("wrong scale", case("wrong-scale", "wrong-scale", "baseline-bf16"), [], [
            ("attention differs on the first shard", lambda r: r["attention"]["signature"] == "first-shard-differs"),
            ("no fix of the mask", no_mask_fix),
            ("no fix at all: the causes are told what would tell them apart",
             lambda r: r["causes"] and r["causes"][0]["fix"] is None and "1/sqrt(D)" in r["causes"][0]["tell_apart"]),
            ("the first rows agree", lambda r: r["attention"]["first_rows_match"])]),
        ("heads reordered", case("heads-reordered", "heads-reordered", "baseline-bf16"), [], [
            ("heads permuted", lambda r: r["attention"]["signature"] == "heads-permuted"),
            ("no fix of the mask", no_mask_fix),
            ("the heads' fix", lambda r: r["causes"] and "source-rank order" in (r["causes"][0]["fix"] or ""))]),
    ]
    for layout in ("batch-first", "sbhd", "head-sharded"):
        checks.append((f"layout {layout}", case("layout-" + layout, "correct-bf16", "baseline-bf16", layout), [], [
            ("read, matching", lambda r: r["attention"]["signature"] == "matches"),
            ("not called wrong", lambda r: "WRONG" not in r["verdict"])]))
    failures = 0
    for name, folder, extra, expectations in checks:
        result, text = diagnose(program, folder, *extra)
        if result is None:
            print(f"FAIL  {name}: seqpar-diagnose failed: {text}")
            failures += 1
            continue
        ok_all = True
        for what, check in expectations:
            ok = bool(check(result))
            ok_all &= ok
            failures += 0 if ok else 1
            print(f"{'ok  ' if ok else 'FAIL'}  {name}: {what}")
        print(f"      verdict: {result['verdict']}" if ok_all else text)
    # [S, H/sp, D] is also [b, S/sp, h*d]'s shape: refused with the hint, then read with it.
    folder = case("layout-head-sharded-3d", "correct-bf16", "baseline-bf16", "head-sharded-3d")
    result, text = diagnose(program, folder)
    ok = result is None and "--attention-layout" in text
    failures += 0 if ok else 1
    print(f"{'ok  ' if ok else 'FAIL'}  layout [S, H/sp, D]: refused with the --attention-layout hint")
    result, text = diagnose(program, folder, "--attention-layout", "head-sharded")
    ok = result is not None and result["attention"]["signature"] == "matches"
    failures += 0 if ok else 1
    print(f"{'ok  ' if ok else 'FAIL'}  layout [S, H/sp, D] with --attention-layout head-sharded: read, matching")
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
