#!/usr/bin/python3
"""Writes a Hugging Face checkpoint directory of a published model's shape with random weights, for
measuring what ./train -e needs in memory and time without downloading the model
(docs/benchmarks.md):

    /usr/bin/python3 dev/hf_random.py OUTDIR [--shape qwen3-0.6b] [--dtype BF16]

config.json as the model's own (the sizes, rope_theta, rms_norm_eps, tied embeddings), and
model.safetensors with matrices ~ N(0, 0.02) and norm weights 1, written a tensor at a time (the
memory of one tensor, not the model's).
"""
import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from attnlog.export_hf import hf_shapes  # noqa: E402  (the names and shapes the export writes)

SHAPES = {
    "qwen3-0.6b": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
                   "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
                   "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                   "rope_scaling": None, "tie_word_embeddings": True, "attention_bias": False,
                   "attention_dropout": 0.0, "use_sliding_window": False, "sliding_window": None,
                   "max_window_layers": 28},
}
ITEMSIZE = {"F32": 4, "BF16": 2}


def encoded(values, dtype):
    """float32 values as little-endian F32 bytes, or BF16 (the upper halves, rounded to nearest even)."""
    bits = np.ascontiguousarray(values, "<f4").view("<u4")
    if dtype == "F32":
        return bits.tobytes()
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()


def write(outdir, config, dtype, seed=0):
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    shapes = list(hf_shapes(config).items())
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes:
        size = int(np.prod(shape)) * ITEMSIZE[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    rng = np.random.default_rng(seed)
    with open(outdir / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in shapes:
            values = np.ones(shape, np.float32) if len(shape) == 1 else 0.02 * rng.standard_normal(shape, np.float32)
            f.write(encoded(values, dtype))
    (outdir / "config.json").write_text(json.dumps(dict(config, torch_dtype="bfloat16" if dtype == "BF16" else "float32"),
                                                   indent=2) + "\n")
    return sum(int(np.prod(shape)) for _, shape in shapes)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    parser.add_argument("--dtype", choices=sorted(ITEMSIZE), default="BF16")
    args = parser.parse_args(argv)
    count = write(args.outdir, SHAPES[args.shape], args.dtype)
    print(f"hf_random: wrote {args.outdir}: {args.shape}, {args.dtype}, {count:,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
