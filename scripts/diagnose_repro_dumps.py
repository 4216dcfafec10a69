#!/usr/bin/python3
"""seqpar-diagnose on seqpar-repro's own dumps must agree with seqpar-repro's verdicts.

    scripts/diagnose_repro_dumps.py SEQPAR_REPRO SEQPAR_DIAGNOSE WORK_DIR

- issue-6868, every policy, at the report's sizes (sp 4, one step) and at sp 4 x dp 2
  with 1001 rows and two steps: seqpar-diagnose reads DIR/<policy>/rank*.safetensors
  with DIR/reference.safetensors and DIR/inputs.safetensors and must give the verdict
  seqpar-repro's --json gives the policy (the settings come from the configuration
  seqpar-repro stores in its files);
- every scenario with a dump (shifted-targets, clipping-norms, dropout, masked-tokens):
  each variant<i>.safetensors against reference.safetensors must give the variant's
  gradient scale and its named cause, its clip-norm scale and cause, and whether it
  equals the reference, as seqpar-repro's --json reports them.

Only the standard library: no PyTorch needed. Exit status 1 when any check fails.
"""
import json
import os
import shutil
import subprocess
import sys

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def run(command):
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def repro_run(repro, work, name, arguments):
    dump = os.path.join(work, name)
    shutil.rmtree(dump, ignore_errors=True)
    run([repro, "--device", "cpu", "--backend", "local", "--dump", dump, "--json", dump + ".json", *arguments])
    with open(dump + ".json") as f:
        return dump, json.load(f)


def diagnose(program, ranks, reference, initial=None):
    command = [program, "--ranks", ranks, "--reference", reference, "--json", "-"]
    if initial:
        command += ["--initial", initial]
    return json.loads(run(command))


class Checks:
    def __init__(self):
        self.failures = 0

    def expect(self, what, actual, expected):
        ok = actual == expected
        self.failures += 0 if ok else 1
        print(f"{'ok  ' if ok else 'FAIL'}  {what}: {actual!r}" + ("" if ok else f", seqpar-repro: {expected!r}"))

    def close(self, what, actual, expected, tolerance=1e-6):
        ok = actual is not None and abs(actual - expected) <= tolerance * max(1.0, abs(expected))
        self.failures += 0 if ok else 1
        print(f"{'ok  ' if ok else 'FAIL'}  {what}: {actual} (seqpar-repro {expected})")


def check_policies(checks, repro, program, work):
    meshes = {"sp4": ["--plot", "", "--steps", "1"],
              "sp4dp2": ["--plot", "", "--steps", "2", "--set", "ds_config.data_parallel_size=2",
                         "--set", "repro.rows=1001"]}
    for mesh, arguments in meshes.items():
        dump, figures = repro_run(repro, work, "issue6868_" + mesh, arguments)
        for policy in figures["policies"]:
            name = policy["name"]
            result = diagnose(program, os.path.join(dump, name, "rank*.safetensors"),
                              os.path.join(dump, "reference.safetensors"), os.path.join(dump, "inputs.safetensors"))
            checks.expect(f"issue-6868 {mesh} {name}: verdict", result["verdict"], policy["verdict"])
            if policy["verdict"] == "CONSISTENT, WRONG GRADIENT SCALE":
                # The dump holds the last step's gradient; --json's scale is step 1's.
                cause = result["gradient_scale"]["cause"]
                checks.expect(f"issue-6868 {mesh} {name}: the scale's cause in seqpar-repro's verdict",
                              bool(cause) and f"({cause})" in policy["verdict_text"], True)
                if figures["steps"] == 1:
                    checks.close(f"issue-6868 {mesh} {name}: gradient scale", result["gradient_scale"]["ratio"],
                                 policy["gradient_scale"])
            if mesh == "sp4" and name == "deepspeed-0.16":
                signs = policy["first_step_signs"]
                checks.expect(f"issue-6868 {mesh} {name}: 2 lr signature", result["two_lr_signature"],
                              signs["opposite_two_lr"] > 0.9 * signs["opposite"])


def check_scenarios(checks, repro, program, work):
    for scenario in ["shifted-targets", "clipping-norms", "dropout", "masked-tokens"]:
        config = os.path.join(SOURCE, "configs", scenario + ".toml")
        dump, figures = repro_run(repro, work, scenario, ["--config", config, "--steps", "2"])
        for i, variant in enumerate(figures["variants"]):
            what = f"{scenario} '{variant['name']}'"
            result = diagnose(program, os.path.join(dump, f"variant{i}.safetensors"),
                              os.path.join(dump, "reference.safetensors"))
            scale = result["gradient_scale"]
            checks.close(what + ": gradient scale", scale["ratio"], variant["gradient_scale"])
            checks.expect(what + ": its cause", scale["cause"], variant["cause"])
            checks.close(what + ": gradient error", scale["relative_error"], variant["gradient_error"], 1e-5)
            checks.close(what + ": clip norm scale", result["clip_norm"]["to_reference"], variant["clip_norm_scale"])
            checks.expect(what + ": its cause", result["clip_norm"]["to_reference_cause"], variant["clip_cause"])
            checks.expect(what + ": equals the reference", result["equals_reference"], variant["equals_baseline"])


def main():
    repro, program, work = (os.path.abspath(a) for a in sys.argv[1:4])
    os.makedirs(work, exist_ok=True)
    checks = Checks()
    check_policies(checks, repro, program, work)
    check_scenarios(checks, repro, program, work)
    print(f"{checks.failures} failure(s)")
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())
