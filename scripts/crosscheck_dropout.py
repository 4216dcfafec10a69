#!/usr/bin/python3
"""Recomputes the dropout scenario's step-1 gradients with PyTorch, from the run's dump.

    seqpar-repro --scenario dropout --dump DIR [...]  &&  scripts/crosscheck_dropout.py DIR

DIR is what the scenario's --dump wrote: inputs.safetensors (x, the initial weight and
bias, and dropout_mask: the one-rank mask of step 1 over every replica's rows, 1 kept and
0 dropped; the configuration as metadata), reference.safetensors and variant<i>.safetensors,
each holding rank 0's combined gradient at step 1 (grad.weight, grad.bias) and the norm
the step clipped with (clip_norm).

First the mask itself: this script draws it again with its own Philox4x32-10 in NumPy
(cuRAND's host stream layout and uniform map), from repro.seed at the position after
the data's draws, element (row, column) at offset + row x out + column, kept where the
uniform value is at most float32(1 - p). It must equal the dump's mask bit for bit and
keep about 1 - p of the elements.

Then, with torch autograd on float32, every sp x dp rank's gradient of its own loss on
its own rows, y = Linear(x), z = y * scale where kept and 0 where dropped, the L1 loss
against x[:, :out] summed and divided by the variant's count, with the rank's mask:
  - "same seed and offset on every rank": rows [0, n) of its replica's mask (every shard
    draws the first shard's words), divided by the replica's count, summed over sp and
    averaged over dp;
  - "mask keyed by global row": its own rows of the mask, the same combination;
  - "global row, exact sums": its own rows, divided by every replica's count, summed.
The combined gradients must match the dump's to 1e-5 of the one-rank gradient's norm,
the clip norms to relative 1e-5; the exact variant's gradient must be the dump's
one-rank gradient bit for bit; and the first variant must be visibly off (the bug is
there to be seen). Exit status 1 when anything differs.
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from crosscheck_pitfall import check_variants, load_dump, shard  # noqa: E402

MASK32 = np.uint64(0xFFFFFFFF)


def philox_words(seed, positions):
    """The 32-bit words at `positions` (uint64 array) of cuRAND's host Philox4x32-10
    stream for `seed`: block position // 4 of subsequence (block % 65536) at step
    (block // 65536), word position % 4."""
    block = positions // np.uint64(4)
    subsequence, step = block % np.uint64(65536), block // np.uint64(65536)
    c = [step & MASK32, step >> np.uint64(32), subsequence & MASK32, subsequence >> np.uint64(32)]
    k0 = np.uint64(seed & 0xFFFFFFFF)
    k1 = np.uint64(seed >> 32)
    for _ in range(10):
        # Products of two 32-bit values fit in uint64.
        p0 = np.uint64(0xD2511F53) * c[0]
        p1 = np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & MASK32,
             (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & MASK32]
        k0 = (k0 + np.uint64(0x9E3779B9)) & MASK32
        k1 = (k1 + np.uint64(0xBB67AE85)) & MASK32
    words = np.stack(c)  # [4, n]
    return words[(positions % np.uint64(4)).astype(np.int64), np.arange(positions.size)]


def uniform(words):
    """cuRAND's (0, 1] float: word x 2^-32 + 2^-33, each operation rounded to float32."""
    two_pow_minus_32 = np.float32(2.3283064e-10)
    return words.astype(np.float32) * two_pow_minus_32 + two_pow_minus_32 / np.float32(2)


def block_rounded(count):
    return (count + 3) // 4 * 4


def draw_mask(seed, offset, rows, columns, keep):
    positions = np.uint64(offset) + np.arange(rows * columns, dtype=np.uint64)
    return (uniform(philox_words(seed, positions)) <= keep).reshape(rows, columns)


def gradient(weight, bias, x_rows, targets, mask_rows, scale, divisor):
    w = weight.clone().requires_grad_(True)
    b = bias.clone().requires_grad_(True)
    y = torch.nn.functional.linear(x_rows, w, b)
    z = torch.where(mask_rows, y * scale, torch.zeros_like(y))
    loss = (z - targets).abs().sum() / divisor
    loss.backward()
    return torch.cat([w.grad.flatten(), b.grad])


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    directory = sys.argv[1]
    inputs, ds, repro = load_dump(directory, ("dropout",))
    rows, sp, dp = repro["rows"], ds["sequence_parallel_size"], ds["data_parallel_size"]
    features, out, seed = repro["in_features"], repro["out_features"], repro["seed"]
    x, weight, bias = inputs["x"], inputs["weight"], inputs["bias"]
    failures = []

    # The numbers nn/dropout.h defines, from p as the op takes it (float32).
    p = np.float32(repro["dropout"])
    keep = np.float32(1.0 - float(p))
    scale = np.float32(1.0 / float(keep))

    # The mask, drawn again: the Linear's weight and bias, then each replica's batch,
    # each draw rounded up to a whole Philox block, come first in the stream.
    offset = block_rounded(out * features) + block_rounded(out) + dp * block_rounded(rows * features)
    drawn = draw_mask(seed, offset, dp * rows, out, keep)
    dumped = inputs["dropout_mask"].numpy()
    if not np.array_equal(dumped, drawn.astype(np.float32)):
        failures.append(f"dropout_mask: {int((dumped != drawn).sum())} elements differ from "
                        "NumPy's Philox draw")
    kept = float(drawn.mean())
    sigma = (float(keep) * (1 - float(keep)) / drawn.size) ** 0.5
    print(f"dropout: sp {sp} x dp {dp}, {rows} rows per replica, p = {float(p):g}; the mask keeps "
          f"{100 * kept:.2f}% (1 - p = {100 * float(keep):.2f}%), drawn again by NumPy: "
          f"{'equal' if not failures else 'DIFFERS'}")
    if abs(kept - float(keep)) > 6 * sigma:
        failures.append(f"dropout_mask keeps {kept}, more than 6 sigma from 1 - p = {keep}")

    mask = torch.from_numpy(dumped != 0)
    scale_t = torch.tensor(scale)
    target = x[:, :out]
    reference = gradient(weight, bias, x, target, mask, scale_t, dp * rows * out)

    def partials(same_offset, divisor):
        parts, wrong = [], 0
        for d in range(dp):
            for r in range(sp):
                first, count = shard(rows, sp, r)
                first += d * rows
                mask_first = d * rows if same_offset else first
                rank_mask = mask[mask_first:mask_first + count]
                wrong += int((rank_mask != mask[first:first + count]).sum())
                parts.append(gradient(weight, bias, x[first:first + count], target[first:first + count],
                                      rank_mask, scale_t, divisor))
        return parts, wrong / mask.numel()

    same_parts, mismatch = partials(True, rows * out)
    global_parts, none_wrong = partials(False, rows * out)
    exact_parts, _ = partials(False, dp * rows * out)
    assert none_wrong == 0
    print(f"  same seed and offset on every rank: {100 * mismatch:.2f}% of the mask's elements wrong")
    variants = {
        "same seed and offset on every rank": sum(same_parts) / dp,
        "mask keyed by global row": sum(global_parts) / dp,
        "global row, exact sums": sum(exact_parts),
    }
    check_variants(directory, "dropout", reference,
                   {name: (g, g.norm().item()) for name, g in variants.items()}, failures,
                   broken=("same seed and offset on every rank",))


if __name__ == "__main__":
    main()
