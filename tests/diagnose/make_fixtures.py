#!/usr/bin/python3
"""Writes the bad-input corpus of seqpar-diagnose (tests/diagnose/bad_input.sh) into DIR,
with nothing but the standard library: safetensors files whose every byte is chosen.

    tests/diagnose/make_fixtures.py DIR
"""
import json
import os
import random
import struct
import sys


def encode(values, dtype):
    if dtype == "F32":
        return struct.pack(f"<{len(values)}f", *values)
    if dtype == "F16":
        return struct.pack(f"<{len(values)}e", *values)
    if dtype == "BF16":  # the upper half of the float32 (values chosen exact in bfloat16)
        return b"".join(struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0])[2:] for v in values)
    return struct.pack(f"<{len(values)}q", *[int(v) for v in values])  # I64


def write(path, tensors, header_length=None, cut=0, extra_header=None, header_text=None, tail=b""):
    """tensors: [(name, dtype, shape, values)]; header_text replaces the JSON written (a
    name twice); tail is appended after the data (bytes no tensor covers)."""
    header, blobs, offset = {}, [], 0
    for name, dtype, shape, values in tensors:
        data = encode(values, dtype)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    header.update(extra_header or {})
    text = header_text.encode() if header_text is not None else json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    body = (header_length if header_length is not None else len(text)).to_bytes(8, "little") + text + b"".join(blobs) + tail
    with open(path, "wb") as f:
        f.write(body[:len(body) - cut])


def model(seed, dtype="F32", weight_shape=(4, 3), names=("weight", "bias")):
    rng = random.Random(seed)
    # Multiples of 1/64 in [-1, 1]: exact in float16 and bfloat16 too.
    draw = lambda n: [rng.randint(-64, 64) / 64 for _ in range(n)]
    rows, cols = weight_shape
    return [(names[0], dtype, list(weight_shape), draw(rows * cols)), (names[1], dtype, [rows], draw(rows))]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    at = lambda name: os.path.join(out, name)
    for rank in range(4):
        write(at(f"good_rank{rank}.safetensors"), model(1))  # four equal ranks
        write(at(f"bf16_rank{rank}.safetensors"), model(1, "BF16"))
        write(at(f"f16_rank{rank}.safetensors"), model(1, "F16"))
        write(at(f"gap_rank{rank if rank < 2 else rank + 1}.safetensors"), model(1))  # ranks 0 1 3 4
    for rank in range(3):
        write(at(f"three_rank{rank}.safetensors"), model(1))
    write(at("names_rank0.safetensors"), model(1))
    write(at("names_rank1.safetensors"), model(1, names=("weight", "bias2")))
    write(at("shapes_rank0.safetensors"), model(1))
    write(at("shapes_rank1.safetensors"), model(1, weight_shape=(3, 4)))
    write(at("dtypes_rank0.safetensors"), model(1))
    write(at("dtypes_rank1.safetensors"), model(1, "BF16"))
    write(at("int_rank0.safetensors"), [("steps", "I64", [2], [1, 2])])
    write(at("truncated_rank0.safetensors"), model(1), cut=5)
    write(at("huge_rank0.safetensors"), model(1), header_length=1 << 60)
    write(at("long_rank0.safetensors"), model(1), header_length=4096)
    with open(at("json_rank0.safetensors"), "wb") as f:
        f.write((16).to_bytes(8, "little") + b"{not json at all")
    with open(at("tiny_rank0.safetensors"), "wb") as f:
        f.write(b"\x01\x02")
    write(at("offsets_rank0.safetensors"), model(1),
          extra_header={"bias": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}})
    write(at("overlap_rank0.safetensors"), model(1),
          extra_header={"bias": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})
    write(at("grads_rank0.safetensors"), [("weight", "F32", [4, 3], [0.5] * 12), ("bias", "F32", [4], [0.5] * 4)])
    write(at("clip_rank0.safetensors"), model(1) + [("clip_norm", "F32", [2], [1, 2])])
    write(at("reference_shapes.safetensors"), model(1, weight_shape=(4, 2)))
    write(at("empty_rank0.safetensors"), [])
    write(at("noname.safetensors"), model(1))
    write(at("noname-too.safetensors"), model(1))
    more_fixtures(at)


def more_fixtures(at):
    """The files users have, and the format's strictness."""
    for rank in range(2):
        write(at(f"model_rank{rank}_step100.safetensors"), model(1))  # rank 0 and 1, not 100
        os.makedirs(at(f"rank{rank}"), exist_ok=True)
        write(at(f"rank{rank}/model.safetensors"), model(1))
        write(at(f"two_rank{rank}.safetensors"), model(1))
        write(at(f"late_rank{rank + 1}.safetensors"), model(1))  # ranks 1 and 2
        # an --optimizer file from a flattened optimizer state: the step count rides along
        write(at(f"adam_rank{rank}.safetensors"), [("exp_avg.weight", "F32", [4, 3], [0.25] * 12),
                                                   ("exp_avg.bias", "F32", [4], [0.25] * 4),
                                                   ("exp_avg_sq.weight", "F32", [4, 3], [1e-4] * 12),
                                                   ("exp_avg_sq.bias", "F32", [4], [1e-4] * 4),
                                                   ("step", "F32", [], [1.0]), ("weight.step", "I64", [1], [1])])
    write(at("only_rank3.safetensors"), model(1))
    with open(at("torch_rank0.pt"), "wb") as f:  # what torch.save writes: a zip archive
        f.write(b"PK\x03\x04" + bytes(60))
    with open(at("pickle_rank0.pt"), "wb") as f:  # before PyTorch 1.6: a pickle
        f.write(b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19." + bytes(40))
    weight = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    write(at("twice_rank0.safetensors"), [("weight", "F32", [1], [1.0])],
          header_text='{"weight": %s, "weight": %s}' % (weight, weight))
    # A shape nested 400,000 deep: quoting it in an error recursed past the stack.
    deep = "[" * 400000 + "]" * 400000
    write(at("deep_rank0.safetensors"), [("weight", "F32", [1], [1.0])],
          header_text='{"weight": {"dtype": "F32", "shape": [%s], "data_offsets": [0, 4]}}' % deep)
    with open(at("deep.json"), "w") as f:
        f.write('{"gradient_clipping": %s}' % deep)
    write(at("tail_rank0.safetensors"), model(1), tail=b"\0" * 8)  # 8 bytes after the last tensor
    write(at("hole_rank0.safetensors"), [("weight", "F32", [4, 3], [0.5] * 12)],
          extra_header={"bias": {"dtype": "F32", "shape": [4], "data_offsets": [64, 80]}}, tail=b"\0" * 32)
    write(at("both_grads_rank0.safetensors"), [("weight", "F32", [4, 3], [0.5] * 12), ("bias", "F32", [4], [0.5] * 4),
                                               ("grad.weight", "F32", [4, 3], [0.5] * 12)])
    # 200,000 entries: nlohmann's callback parser scanned the header once per entry (minutes).
    write(at("many_rank0.safetensors"), [], header_text="{%s}" % ", ".join('"t%d": {}' % i for i in range(200000)))
    # Shapes and offsets past any file: refused before a byte is allocated for them.
    entry = '{"weight": {"dtype": "F32", "shape": %s, "data_offsets": [0, %d]}}'
    one = [("weight", "F32", [1], [1.0])]
    write(at("overflow_rank0.safetensors"), one, header_text=entry % ("[4294967296, 4294967296]", 4))  # 2^64
    write(at("petabyte_rank0.safetensors"), one, header_text=entry % ("[140737488355328]", 1 << 49))  # 2^47 floats
    write(at("negative_rank0.safetensors"), one, header_text=entry % ("[2, -2]", 4))
    # names that would drive a terminal or split a line
    write(at("esc_rank0.safetensors"), [("w\x1b[31mred\nline", "I64", [1], [1])])
    for rank in range(2):
        write(at(f"escnames_rank{rank}.safetensors"), [("w\x1b]0;title\x07", "F32", [2], [0.5, 0.25 * rank])])


if __name__ == "__main__":
    main()
