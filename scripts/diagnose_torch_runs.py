#!/usr/bin/python3
"""Runs the bug report's model with torch.distributed, saves each rank's tensors, and
checks what seqpar-diagnose says about them.

    scripts/diagnose_torch_runs.py path/to/seqpar-diagnose WORK_DIR [--rows N]

Four gloo processes on the CPU train the report's Linear(640, 16) with its L1 loss
against x[:, :16] and one AdamW step (lr 1e-4, betas 0.9/0.999, eps 1e-8, weight decay
0.01, clipping at 1.0), each on its torch.chunk of x, under each way of combining the
gradients below. Each rank saves what a user would (the README's snippet): its
parameters after the step, grad.* after the reduction, local_grad.* before it, the
clip norm, and Adam's moments in a file of their own. One process on all rows is the
reference. Then seqpar-diagnose reads each run's files and must give:

  no reduction             BROKEN: RANKS DIVERGE, the 2 lr signature, the group-of-one cause
  sum of local means       CONSISTENT, WRONG GRADIENT SCALE, x sp (4)
  average (the right one)  CONSISTENT, NOT EXACT (rounding only) or IDENTICAL
  mean of partial norms    CONSISTENT, WRONG CLIP NORM, the mean of the ranks' partial norms
  replicated squares       CONSISTENT, WRONG CLIP NORM, x sqrt(sp)
  shard-local shift        CONSISTENT, WRONG GRADIENT, shifted-targets among the causes

and, for the run with no reduction read from parameters and moments only (no
gradients), the gradients recovered from exp_avg with the same verdict.

The user's three runs (no reduction, the sum, the average) are read again with less
saved, on the ranks and in the baseline alike, and the verdict must say only what
those files can show:

  parameters only       no reduction: the 2 lr signature still shows it; the sum and the
                        average: PARAMETERS CLOSE, GRADIENT NOT CHECKED (after Adam's first
                        step a steady x sp is nearly invisible in the parameters); the sum
                        with clip_norm saved: the clip norm shows x sp
  parameters, moments   the scale from exp_avg: the sum x sp (4) once the clip norms take
                        the clipping out (without them a scale, unnamed, and a note), the
                        average 1
Exit status 1 when any check fails, 77 when PyTorch is not installed.
"""
import json
import os
import subprocess
import sys

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError:
    print("skipped: PyTorch is not installed")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from crosscheck import write_safetensors  # noqa: E402

SP = 4
LR, BETAS, EPS, WEIGHT_DECAY, CLIP = 1e-4, (0.9, 0.999), 1e-8, 0.01, 1.0
POLICIES = ["none", "sum", "average", "mean-of-norms", "replicated-squares", "shard-local-shift"]


def model_and_data(rows):
    torch.manual_seed(12345)  # every rank: the same model and the same x
    model = torch.nn.Linear(640, 16)
    x = torch.randn(rows, 640)
    return model, x


def loss_of(model, rows, shift):
    """The report's loss, or with next-row targets (row i's target is row i+1's)."""
    if shift:
        return (rows[1:, :16] - model(rows[:-1])).abs().mean()
    return (rows[:, :16] - model(rows)).abs().mean()


def norm(grads):
    return torch.sqrt(sum((g.double() ** 2).sum() for g in grads))


def combine(policy, grads):
    """The gradients after the policy's reduction (in place) and the norm it clips with."""
    local_norm = norm(grads)
    if policy == "none":
        return local_norm
    for g in grads:
        dist.all_reduce(g, op=dist.ReduceOp.SUM)
        if policy != "sum":
            g /= SP
    if policy == "mean-of-norms":
        total = local_norm.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total / SP
    if policy == "replicated-squares":
        square = norm(grads) ** 2
        dist.all_reduce(square, op=dist.ReduceOp.SUM)
        return torch.sqrt(square)
    return norm(grads)


def step(model, loss, clip_norm_of):
    """backward, combine, clip, one AdamW step; returns (local grads, grads, clip norm, optimizer)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    local = [g.clone() for g in grads]
    clip_norm = clip_norm_of(grads)
    used = [g.clone() for g in grads]
    coefficient = min(1.0, CLIP / (float(clip_norm) + 1e-6))
    for g in grads:
        g.mul_(coefficient)
    optimizer.step()
    return local, used, clip_norm, optimizer


def tensors_of(model, local, used, clip_norm, optimizer):
    names = ["weight", "bias"]
    params = dict(zip(names, model.parameters()))
    tensors = {n: p.detach().clone() for n, p in params.items()}
    tensors.update({"local_grad." + n: g for n, g in zip(names, local)})
    tensors["clip_norm"] = torch.tensor([float(clip_norm)])
    grads = {n: g for n, g in zip(names, used)}  # a --grads file: names without the prefix
    moments = {}
    for n, p in params.items():
        state = optimizer.state[p]
        moments["exp_avg." + n] = state["exp_avg"].clone()
        moments["exp_avg_sq." + n] = state["exp_avg_sq"].clone()
    return tensors, grads, moments


def rank_main(rank, work, rows):
    dist.init_process_group("gloo", init_method="file://" + os.path.join(work, "store"), rank=rank, world_size=SP)
    for policy in POLICIES:
        model, x = model_and_data(rows)
        shard = torch.chunk(x, SP)[rank]
        local, used, clip_norm, optimizer = step(model, loss_of(model, shard, policy == "shard-local-shift"),
                                                 lambda grads: combine(policy, grads))
        tensors, grads, moments = tensors_of(model, local, used, clip_norm, optimizer)
        folder = os.path.join(work, policy)
        write_safetensors(tensors, os.path.join(folder, f"model_rank{rank}.safetensors"))
        write_safetensors(grads, os.path.join(folder, f"grads_rank{rank}.safetensors"))
        write_safetensors(moments, os.path.join(folder, f"adam_rank{rank}.safetensors"))
        parameters = {n: tensors[n] for n in ("weight", "bias")}
        write_safetensors(parameters, os.path.join(folder, f"params_rank{rank}.safetensors"))
        write_safetensors({**parameters, "clip_norm": tensors["clip_norm"]}, os.path.join(folder, f"pclip_rank{rank}.safetensors"))
    dist.destroy_process_group()


def save_reference(work, rows, shift):
    model, x = model_and_data(rows)
    initial = {"weight": model.weight.detach().clone(), "bias": model.bias.detach().clone()}
    local, used, clip_norm, optimizer = step(model, loss_of(model, x, shift), norm)
    tensors, grads, moments = tensors_of(model, local, used, clip_norm, optimizer)
    tensors.update({"grad." + n: g for n, g in grads.items()})
    name = "reference_shifted" if shift else "reference"
    write_safetensors(tensors, os.path.join(work, name + ".safetensors"))
    parameters = {n: tensors[n] for n in ("weight", "bias")}
    write_safetensors(parameters, os.path.join(work, name + "_params.safetensors"))
    write_safetensors({**parameters, "clip_norm": tensors["clip_norm"]}, os.path.join(work, name + "_pclip.safetensors"))
    write_safetensors(moments, os.path.join(work, name + "_adam.safetensors"))
    write_safetensors(initial, os.path.join(work, "initial.safetensors"))


def diagnose(program, work, policy, *extra):
    """extra may name its own --ranks FILE and --baseline FILES (the defaults: the whole
    model files and the whole reference, under --reference, the baseline's old name)."""
    folder = os.path.join(work, policy)
    reference = "reference_shifted" if policy == "shard-local-shift" else "reference"
    ranks = [] if "--ranks" in extra else ["--ranks", os.path.join(folder, "model_rank*.safetensors")]
    baseline = [] if "--baseline" in extra else ["--reference", os.path.join(work, reference + ".safetensors")]
    command = [program, *ranks, *baseline,
               "--initial", os.path.join(work, "initial.safetensors"),
               "--ds-config", os.path.join(os.path.dirname(__file__), "..", "configs", "ds_config.json"),
               "--json", os.path.join(folder, "diagnosis.json"), *extra]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"seqpar-diagnose failed ({run.returncode}) on {policy}: {run.stderr}")
    with open(os.path.join(folder, "diagnosis.json")) as f:
        return json.load(f), run.stdout


def scenarios_of(result):
    return " | ".join(cause["scenario"] for cause in result["causes"])


def not_checked(result, check):
    return any(line["check"] == check and not line["checked"] for line in result["evidence"])


def less_saved():
    """The user's three runs with parameters only, and with parameters and moments."""
    def files(policy, ranks, *baseline, optimizer=False):
        extra = ["--ranks", f"{{work}}/{policy}/{ranks}_rank*.safetensors"]
        for name in baseline:
            extra += ["--baseline", f"{{work}}/reference_{name}.safetensors"]
        return extra + (["--optimizer", f"{{work}}/{policy}/adam_rank*.safetensors"] if optimizer else [])
    close = "PARAMETERS CLOSE, GRADIENT NOT CHECKED"
    return {
        "none-params": (files("none", "params", "params"), [
            ("verdict", lambda r: r["verdict"] == "BROKEN: RANKS DIVERGE"),
            ("2 lr signature", lambda r: r["two_lr_signature"] is True),
            ("group-of-one cause", lambda r: "--policy deepspeed-0.16" in scenarios_of(r)),
            ("gradient scale not checked", lambda r: not_checked(r, "gradient scale"))]),
        "none-moments-only": (files("none", "params", "params", "adam", optimizer=True), [
            ("verdict", lambda r: r["verdict"] == "BROKEN: RANKS DIVERGE"),
            ("the ranks' moments average to the baseline's",
             lambda r: r["mean_gradient_scale"]["cause"] == "" and abs(r["mean_gradient_scale"]["ratio"] - 1) < 1e-3)]),
        "sum-params": (files("sum", "params", "params"), [
            ("verdict", lambda r: r["verdict"] == close),
            ("gradient scale not checked", lambda r: not_checked(r, "gradient scale")),
            ("no gradient scale", lambda r: r["gradient_scale"] is None)]),
        "sum-params-clip": (files("sum", "pclip", "pclip"), [
            ("verdict", lambda r: r["verdict"] == "CONSISTENT, WRONG CLIP NORM"),
            ("x sp in the clip norm", lambda r: r["clip_norm"]["to_reference_cause"] == "x sp (4)"),
            ("with-mpu scenario", lambda r: "--policy with-mpu" in scenarios_of(r))]),
        "sum-moments": (files("sum", "params", "params", "adam", optimizer=True), [
            ("verdict", lambda r: r["verdict"] == "CONSISTENT, WRONG GRADIENT SCALE"),
            ("from exp_avg", lambda r: r["gradient_scale"]["from"].startswith("exp_avg")),
            ("the clipping named", lambda r: any("after clipping" in note for note in r["notes"]))]),
        "sum-moments-clip": (files("sum", "pclip", "pclip", "adam", optimizer=True), [
            ("verdict", lambda r: r["verdict"] == "CONSISTENT, WRONG GRADIENT SCALE"),
            ("x sp from exp_avg", lambda r: r["gradient_scale"]["cause"] == "x sp (4)"
             and r["gradient_scale"]["from"].startswith("exp_avg")),
            ("with-mpu scenario", lambda r: "--policy with-mpu" in scenarios_of(r))]),
        "average-params": (files("average", "params", "params"), [
            ("verdict", lambda r: r["verdict"] == close),
            ("gradient scale not checked", lambda r: not_checked(r, "gradient scale"))]),
        "average-moments": (files("average", "params", "params", "adam", optimizer=True), [
            ("verdict", lambda r: r["verdict"] in ("CONSISTENT, NOT EXACT", "IDENTICAL TO ONE-RANK TRAINING")),
            ("scale 1 from exp_avg", lambda r: r["gradient_scale"]["from"].startswith("exp_avg")
             and r["gradient_scale"]["cause"] == "" and abs(r["gradient_scale"]["ratio"] - 1) < 1e-5),
            ("no cause", lambda r: r["causes"] == [])]),
    }


def expectations():
    """case -> (extra arguments, [(what, predicate on the JSON)]); the case's policy is
    its name up to the first '-' that ends a policy's name."""
    grads = lambda policy: ["--grads", f"{{work}}/{policy}/grads_rank*.safetensors"]
    return {**less_saved(),
        "none": (grads("none"), [
            ("verdict", lambda r: r["verdict"] == "BROKEN: RANKS DIVERGE"),
            ("2 lr signature", lambda r: r["two_lr_signature"] is True),
            ("each rank alone", lambda r: len(r["rank_groups"]) == SP),
            ("group-of-one cause", lambda r: "--policy deepspeed-0.16" in scenarios_of(r)),
            ("the ranks' gradients average to the reference", lambda r: r["mean_gradient_scale"]["cause"] == ""),
            ("own clip norms", lambda r: r["clip_norm"]["own_gradient_norms"] is True)]),
        "none-moments": (["--optimizer", "{work}/none/adam_rank*.safetensors"], [
            ("verdict", lambda r: r["verdict"] == "BROKEN: RANKS DIVERGE"),
            ("2 lr signature", lambda r: r["two_lr_signature"] is True),
            ("group-of-one cause", lambda r: "--policy deepspeed-0.16" in scenarios_of(r))]),
        "sum": (grads("sum"), [
            ("verdict", lambda r: r["verdict"] == "CONSISTENT, WRONG GRADIENT SCALE"),
            ("x sp", lambda r: r["gradient_scale"]["cause"] == "x sp (4)"),
            ("with-mpu scenario", lambda r: "--policy with-mpu" in scenarios_of(r))]),
        "average": (grads("average"), [
            ("verdict", lambda r: r["verdict"] in ("CONSISTENT, NOT EXACT", "IDENTICAL TO ONE-RANK TRAINING")),
            ("scale 1", lambda r: r["gradient_scale"]["cause"] == "" and abs(r["gradient_scale"]["ratio"] - 1) < 1e-5),
            ("no cause", lambda r: r["causes"] == [])]),
        "mean-of-norms": (grads("mean-of-norms"), [
            ("verdict", lambda r: r["verdict"] == "CONSISTENT, WRONG CLIP NORM"),
            ("mean of partial norms", lambda r: r["clip_norm"]["mean_of_partials"] is True),
            ("clipping-norms scenario", lambda r: "--scenario clipping-norms" in scenarios_of(r))]),
        "replicated-squares": (grads("replicated-squares"), [
            ("verdict", lambda r: r["verdict"] == "CONSISTENT, WRONG CLIP NORM"),
            ("x sqrt(sp)", lambda r: r["clip_norm"]["to_gradient_cause"] == "x sqrt(sp) (2)"),
            ("clipping-norms scenario", lambda r: "--scenario clipping-norms" in scenarios_of(r))]),
        "shard-local-shift": (grads("shard-local-shift"), [
            ("verdict", lambda r: r["verdict"] == "CONSISTENT, WRONG GRADIENT"),
            ("shifted-targets among the causes", lambda r: "--scenario shifted-targets" in scenarios_of(r))]),
    }


def main():
    program, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    rows = int(sys.argv[sys.argv.index("--rows") + 1]) if "--rows" in sys.argv else 400
    for policy in POLICIES:
        os.makedirs(os.path.join(work, policy), exist_ok=True)
    store = os.path.join(work, "store")
    if os.path.exists(store):
        os.remove(store)
    mp.spawn(rank_main, args=(work, rows), nprocs=SP, join=True)
    save_reference(work, rows, shift=False)
    save_reference(work, rows, shift=True)
    failures = 0
    for case, (extra, checks) in expectations().items():
        policy = next(p for p in sorted(POLICIES, key=len, reverse=True) if case == p or case.startswith(p + "-"))
        result, text = diagnose(program, work, policy, *[a.format(work=work) for a in extra])
        for what, check in checks:
            ok = check(result)
            failures += 0 if ok else 1
            print(f"{'ok  ' if ok else 'FAIL'}  {case}: {what}")
        if not all(check(result) for _, check in checks):
            print(text)
        else:
            print(f"      verdict: {result['verdict']}")
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
