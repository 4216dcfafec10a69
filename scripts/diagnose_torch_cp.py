#!/usr/bin/python3
"""A context-parallel attention layer emulated in PyTorch, its mistakes, saved as a user
saves them, and what seqpar-diagnose says about each.

    scripts/diagnose_torch_cp.py path/to/seqpar-diagnose WORK_DIR

The layer: q, k, v = x Wq, x Wk, x Wv (H heads of D), RoPE on q and k at each token's
position, causal softmax attention with scale 1/sqrt(D) and the mask decided on the
positions, out = o Wo, the mean squared error against a target, one AdamW step on float32
master weights. The cp = 4 ranks each hold S/4 tokens, contiguous (rank r: block r) or
zigzag (rank r: chunks r and 7 - r of 8); each rank's queries attend to every rank's keys
(gathered, or visited by a ring, in global order), and its backward runs block by block,
as a ring does: rank r's queries against rank j's keys, dQ kept by r, dK and dV carried
to j. Emulated in one process. Each rank saves its parameters after the step, grad.* (the
reduced gradient), its rows of the attention output (`attention`, in the rank's own row
order), of q and k after RoPE (attention.query, attention.key) and of their gradients and
v's (attention.query.grad, attention.key.grad, attention.value.grad); one process on the
whole sequence is the baseline. The runs:

  correct, bf16 / fp32    contiguous and zigzag; the ranks' forward a bf16 kernel of
                          another op order than the baseline's: not called wrong.
  stale K/V               the ring's backward computes each hop with the rank's own K and
                          V instead of the visiting block's; the forward is right.
  dK, dV not reduced      each rank keeps its own queries' part of dK and dV.
  loss per rank           each rank's loss a mean over its own tokens, summed over ranks:
                          every gradient x cp.
  positions contiguous    zigzag tokens rotated and masked at the positions of contiguous
                          blocks (rank r: r*S/cp ..).
  dK, dV whole            the not-reduced run again, each rank saving its gathered K's and
                          V's gradients over the whole sequence: their sum is the baseline's;
                          and the correct run saved so, its weight gradients one rank's.
  keys lost, zigzag       each rank attends to its own rows alone (K and V never gathered):
                          read in global order by zigzag chunk, chunk 0 right, q and k right.
  stale K/V, no gradients of the attention's inputs saved: a wrong gradient, the forward
                          right, and the report says what to save.

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

CP, S, H, D, MODEL = 4, 256, 4, 16, 64
LR = 1e-3
NAMES = ("attention", "attention.query", "attention.key", "attention.query.grad", "attention.key.grad",
         "attention.value.grad")


def rank_rows(layout, ranks=CP):
    """The token indices each rank holds, in its own order."""
    if ranks == 1:
        return [torch.arange(S)]
    if layout == "contiguous":
        return [torch.arange(r * S // ranks, (r + 1) * S // ranks) for r in range(ranks)]
    chunk = S // (2 * ranks)
    return [torch.cat([torch.arange(r * chunk, (r + 1) * chunk),
                       torch.arange((2 * ranks - 1 - r) * chunk, (2 * ranks - r) * chunk)]) for r in range(ranks)]


def rope(x, positions):
    """[S, H, D] rotated at `positions` (Hugging Face's rotate_half pairing), in x's dtype."""
    inverse = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)
    angles = positions.float()[:, None] * inverse[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[:, None, :].to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[:, None, :].to(x.dtype)
    half = torch.cat([-x[..., D // 2:], x[..., :D // 2]], dim=-1)
    return x * cos + half * sin


class RankedAttention(torch.autograd.Function):
    """Causal attention of every rank's queries against every key, the backward block by
    block (rank r's queries, rank j's keys). `mistake`: None, "stale" (each hop computed
    with the rank's own K and V), "unreduced" (dK, dV only from the keys' own rank)."""

    @staticmethod
    def forward(ctx, q, k, v, positions, rows, compute, mistake, partials):
        scale = 1 / math.sqrt(D)
        owner = torch.empty(q.shape[0], dtype=torch.long)
        for r, idx in enumerate(rows):
            owner[idx] = r
        ctx.owner = owner
        out, lse = torch.empty_like(q), torch.empty(q.shape[0], H)
        for idx in rows:
            scores = torch.einsum("shd,thd->hst", q[idx].to(compute), k.to(compute)) * scale
            mask = RankedAttention.visible(positions, ctx.owner, idx, torch.arange(q.shape[0]), mistake)
            scores = scores.masked_fill(~mask, float("-inf"))
            out[idx] = torch.einsum("hst,thd->shd", torch.softmax(scores, dim=-1), v.to(compute)).to(q.dtype)
            lse[idx] = torch.logsumexp(scores.float(), dim=-1).T
        ctx.save_for_backward(q, k, v, positions, out, lse)
        ctx.rows, ctx.mistake, ctx.partials = rows, mistake, partials
        return out

    @staticmethod
    def visible(positions, owner, queries, keys, mistake):
        """Causal on the positions; with keys lost, within the query's own rank too."""
        mask = positions[queries][:, None] >= positions[keys][None, :]
        if mistake == "keys-lost":
            mask &= owner[queries][:, None] == owner[keys][None, :]
        return mask

    @staticmethod
    def backward(ctx, grad):
        q, k, v, positions, out, lse = [t.float() if t.is_floating_point() else t for t in ctx.saved_tensors]
        grad, scale = grad.float(), 1 / math.sqrt(D)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for r, mine in enumerate(ctx.rows):
            # Rank r's queries' part of every key's gradient: what its gathered K and V hold.
            own_dk, own_dv = torch.zeros_like(k), torch.zeros_like(v)
            delta = (grad[mine] * out[mine]).sum(-1).T  # [H, s]
            for j, theirs in enumerate(ctx.rows):
                keys = mine if ctx.mistake == "stale" else theirs  # the block used for K and V
                mask = RankedAttention.visible(positions, ctx.owner, mine, theirs, ctx.mistake)
                scores = torch.einsum("shd,thd->hst", q[mine], k[keys]) * scale
                p = torch.exp(scores - lse[mine].T[..., None]).masked_fill(~mask, 0.0)
                dp = torch.einsum("shd,thd->hst", grad[mine], v[keys])
                ds = p * (dp - delta[..., None])
                dq[mine] += torch.einsum("hst,thd->shd", ds, k[keys]) * scale
                own_dk[theirs] += torch.einsum("hst,shd->thd", ds, q[mine]) * scale
                own_dv[theirs] += torch.einsum("hst,shd->thd", p, grad[mine])
                if ctx.mistake == "unreduced" and r != j:
                    continue
                dk[theirs] += torch.einsum("hst,shd->thd", ds, q[mine]) * scale
                dv[theirs] += torch.einsum("hst,shd->thd", p, grad[mine])
            ctx.partials.append((own_dk.to(ctx.saved_tensors[1].dtype), own_dv.to(ctx.saved_tensors[2].dtype)))
        dtype = ctx.saved_tensors[0].dtype
        return dq.to(dtype), dk.to(dtype), dv.to(dtype), None, None, None, None, None


def initial_state():
    generator = torch.Generator().manual_seed(2027)
    weights = {name: torch.randn(rows, cols, generator=generator) / math.sqrt(cols)
               for name, rows, cols in [("wq", H * D, MODEL), ("wk", H * D, MODEL), ("wv", H * D, MODEL),
                                        ("wo", MODEL, H * D)]}
    x = torch.randn(S, MODEL, generator=generator)
    target = torch.randn(S, MODEL, generator=generator)
    return weights, x, target


def run(master, x, target, dtype, ranks, layout="contiguous", mistake=None):
    """One step of the layer over `ranks` ranks; returns the masters after the step, the
    gradients, and the attention tensors (every token, global order)."""
    params = {n: w.detach().to(dtype).clone().requires_grad_() for n, w in master.items()}
    rows = rank_rows(layout, ranks)
    positions = torch.arange(S)
    if mistake == "positions":  # the zigzag's tokens at the positions of contiguous blocks
        for r, idx in enumerate(rows):
            positions[idx] = torch.arange(r * S // ranks, (r + 1) * S // ranks)
    xs = x.to(dtype)
    q, k, v = [(xs @ params[n].T).view(S, H, D) for n in ("wq", "wk", "wv")]
    q, k = rope(q, positions), rope(k, positions)
    for t in (q, k, v):
        t.retain_grad()
    compute = torch.float32 if ranks == 1 else dtype  # the baseline's kernel: float32, then rounded
    partials = []
    o = RankedAttention.apply(q, k, v, positions, rows, compute,
                              mistake if mistake in ("stale", "unreduced", "keys-lost") else None, partials)
    out = o.reshape(S, H * D) @ params["wo"].T
    loss = ((out.float() - target) ** 2).sum() / out.numel()
    if mistake == "loss-per-rank":  # each rank's mean over its S/cp tokens, summed
        loss = loss * ranks
    loss.backward()
    grads = {n: p.grad for n, p in params.items()}
    masters = {n: w.detach().clone().requires_grad_() for n, w in master.items()}
    optimizer = torch.optim.AdamW(list(masters.values()), lr=LR, weight_decay=0.0)
    for n, w in masters.items():
        w.grad = grads[n].float()
    optimizer.step()
    attention = dict(zip(NAMES, [t.detach().reshape(S, H * D) for t in (o, q, k, q.grad, k.grad, v.grad)]))
    attention["partials"] = [(dk.reshape(S, H * D), dv.reshape(S, H * D)) for dk, dv in partials]
    return {n: w.detach() for n, w in masters.items()}, grads, attention, rows


def save_run(folder, result, sp_ranks, saved=NAMES, whole=False):
    """whole: the ranks save dK and dV over the whole sequence, their gathered K's and V's
    gradients (each its own queries' part)."""
    os.makedirs(folder, exist_ok=True)
    master, grads, attention, rows = result
    common = {**master, **{"grad." + n: g for n, g in grads.items()}}
    if not sp_ranks:
        write_safetensors({**common, **{n: attention[n] for n in saved}}, os.path.join(folder, "baseline.safetensors"))
        return
    for r, idx in enumerate(rows):
        tensors = {**common, **{n: attention[n][idx] for n in saved}}
        if whole:
            tensors["attention.key.grad"], tensors["attention.value.grad"] = attention["partials"][r]
        write_safetensors(tensors, os.path.join(folder, f"model_rank{r}.safetensors"))


def diagnose(program, folder, *extra):
    command = [program, "--ranks", os.path.join(folder, "model_rank*.safetensors"),
               "--baseline", os.path.join(folder, "baseline.safetensors"), "--lr", str(LR), "--betas", "0.9,0.999",
               "--json", os.path.join(folder, "diagnosis.json"), *extra]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        return None, result.stdout + result.stderr
    with open(os.path.join(folder, "diagnosis.json")) as f:
        return json.load(f), result.stderr


def backward(r):
    return r["attention"]["backward"]["signature"]


def fixes(r):
    return [cause["fix"] or "" for cause in r["causes"]]


def not_wrong(r):
    return "WRONG" not in r["verdict"] and "UNLIKE" not in r["verdict"] and not r["causes"]


def main():
    program, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    torch.manual_seed(0)
    master, x, target = initial_state()
    baselines = {tag: run(master, x, target, dtype, 1) for dtype, tag in [(torch.bfloat16, "bf16"),
                                                                          (torch.float32, "fp32")]}

    def case(name, dtype_tag, layout, mistake=None, saved=NAMES, whole=False):
        folder = os.path.join(work, name)
        dtype = torch.bfloat16 if dtype_tag == "bf16" else torch.float32
        save_run(folder, run(master, x, target, dtype, CP, layout, mistake), True, saved, whole)
        save_run(folder, baselines[dtype_tag], False, saved)
        return folder

    forward_right = ("the forward matches", lambda r: r["attention"]["signature"] in ("matches", "rows-permuted"))
    checks = []
    for layout in ("contiguous", "zigzag"):
        for tag in ("bf16", "fp32"):
            checks.append((f"correct {tag}, {layout}", case(f"correct-{tag}-{layout}", tag, layout), [
                ("not called wrong, no cause", not_wrong),
                forward_right,
                ("the backward matches", lambda r: backward(r) == "matches"),
                ("read as zigzag" if layout == "zigzag" else "read contiguous",
                 (lambda r: r["attention"]["zigzag"]) if layout == "zigzag" else (lambda r: not r["attention"]["zigzag"])),
                *([("CONSISTENT, NOT EXACT", lambda r: r["verdict"] == "CONSISTENT, NOT EXACT")] if tag == "fp32" else [])]))
        checks.append((f"stale K/V, {layout}", case(f"stale-{layout}", "bf16", layout, "stale"), [
            forward_right,
            ("stale K/V", lambda r: backward(r) == "stale-keys-values"),
            ("the ring's fix", lambda r: any("received at that hop" in f for f in fixes(r))),
            ("called wrong", lambda r: "WRONG" in r["verdict"] or "UNLIKE" in r["verdict"])]))
        checks.append((f"dK, dV not reduced, {layout}", case(f"unreduced-{layout}", "bf16", layout, "unreduced"), [
            forward_right,
            ("not reduced", lambda r: backward(r) == "keys-values-not-reduced"),
            ("the reduction's fix", lambda r: any("sum dK and dV over the CP ranks" in f for f in fixes(r)))]))
    checks += [
        ("loss per rank", case("loss-per-rank", "bf16", "zigzag", "loss-per-rank"), [
            forward_right,
            ("scaled x cp", lambda r: backward(r) == "scaled" and abs(r["attention"]["backward"]["scale"] - CP) < 0.05),
            ("the loss's fix", lambda r: any("token count of the whole sequence" in f for f in fixes(r))),
            ("WRONG GRADIENT SCALE", lambda r: r["verdict"] == "CONSISTENT, WRONG GRADIENT SCALE")]),
        ("positions contiguous under zigzag", case("positions", "bf16", "zigzag", "positions"), [
            ("positions not zigzag", lambda r: r["attention"]["signature"] == "positions-not-zigzag"),
            ("contiguous positions named", lambda r: r["attention"]["contiguous_positions"]),
            ("the positions' fix, not the mask's alone",
             lambda r: any("global position under the zigzag" in f for f in fixes(r))),
            ("backward not judged", lambda r: backward(r) == "not-judged")]),
        ("dK, dV not reduced, saved over the whole sequence",
         case("unreduced-whole", "bf16", "zigzag", "unreduced", whole=True), [
            forward_right,
            ("their sum is the baseline's", lambda r: backward(r) == "keys-values-partial"),
            ("the reduction's fix", lambda r: any("sum dK and dV over the CP ranks" in f for f in fixes(r)))]),
        ("correct, dK and dV saved over the whole sequence before their reduction",
         case("correct-whole", "bf16", "contiguous", whole=True), [
            ("not called wrong, no cause", not_wrong),
            ("the backward matches", lambda r: backward(r) == "matches"),
            ("a note says the reduction ran", lambda r: any("before their reduction" in n for n in r["notes"]))]),
        ("keys lost, zigzag", case("keys-lost", "bf16", "zigzag", "keys-lost"), [
            ("read as zigzag", lambda r: r["attention"]["zigzag"]),
            ("keys lost", lambda r: r["attention"]["signature"] == "keys-lost"),
            ("by zigzag chunk", lambda r: len(r["attention"]["output"]["shards"]) == 2 * CP),
            ("the gather's fix, no all-to-all",
             lambda r: any("gather every rank's K and V" in f and "all-to-all" not in f for f in fixes(r)))]),
        ("stale K/V, parameters and attention output only",
         case("stale-no-gradients", "bf16", "contiguous", "stale", saved=("attention",)), [
            forward_right,
            ("backward not saved", lambda r: backward(r) == "not-saved"),
            ("WRONG GRADIENT", lambda r: r["verdict"] == "CONSISTENT, WRONG GRADIENT")]),
    ]
    failures = 0
    for name, folder, expectations in checks:
        result, text = diagnose(program, folder)
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
        if ok_all:
            print(f"      verdict: {result['verdict']}; backward: {backward(result)}")
        else:
            print(json.dumps({k: result[k] for k in ("verdict", "causes", "notes")}, indent=1))
            print(json.dumps(result["attention"], indent=1)[:3000])
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
