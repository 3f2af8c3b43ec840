"""Exports a checkpoint of ./train as a Hugging Face transformers model (Qwen3ForCausalLM or LlamaForCausalLM).

    attnlog-export-hf CKPT OUTDIR [--dtype float32|bfloat16] [--tokenizer FILE]

(or /usr/bin/python3 scripts/export_hf.py from the checkout).

The model of docs/model.md is Qwen3's architecture: pre-norm RMSNorm blocks, a per-head RMSNorm of
queries and keys with learnable gains before rotate-half RoPE, grouped-query attention, a SwiGLU MLP
and no biases; without the norm of queries and keys it is Llama's. A checkpoint trained with
--qk-norm gain (the default) therefore becomes a Qwen3 model by renaming its tensors; one of
--qk-norm plain too, its q and k norms' weights 1 (Qwen3 then computes exactly that model, though
training it in transformers would learn them); one of --qk-norm none a Llama model. What the
configuration carries goes along: an attention width other than d_model (head_dim), untied
embeddings (lm_head.weight), rope_theta and the Llama 3 RoPE scaling (rope_scaling), rms_norm_eps.
The names are those ./train -e reads (llmc/hf_checkpoint.h), so a model imported from the Hugging
Face layout and exported in float32 comes back with the same bits.
OUTDIR receives

    model.safetensors      the weights: float32 (exact) or bfloat16 (rounded to nearest, ties to even)
    tokenizer.model        the run's SentencePiece model, and tokenizer_config.json (LlamaTokenizer,
                           BOS put before the text as prepare_data puts it before every document)
    config.json            the Qwen3Config or LlamaConfig, written last, once the weights are in place

The tokenizer is --tokenizer FILE, else tokenizer.model next to the checkpoint, else the default
corpus's data/brown/tokenizer.model; with none of them the model is exported alone. Each file is
written under a temporary name and renamed, so a failed export leaves no half-written file.

Loading the export with transformers (its tokenizer also needs sentencepiece):

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("OUTDIR", torch_dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained("OUTDIR")
    ids = tokenizer("The jury said", return_tensors="pt").input_ids  # BOS first
    # The training data separates documents by BOS alone, so BOS is where the model ends one.
    out = model.generate(ids, max_new_tokens=40, do_sample=True, eos_token_id=tokenizer.bos_token_id)
    print(tokenizer.decode(out[0], skip_special_tokens=True))

test/test_export_hf.py checks the export's logits against attnlog.model_torch, test/test_hf_import.py
the round trips through ./train -e.
"""
import json
import os
import struct
import sys

import numpy as np

from attnlog.commands import DEFAULT_DATA, ArgumentParser, UserError, run
from attnlog.layout import GAINS
from attnlog.model_torch import read_checkpoint

DEFAULT_TOKENIZER = os.path.join(DEFAULT_DATA, "tokenizer.model")
# The special pieces of every tokenizer prepare_data trains (llmc/dataprep.h).
UNK, BOS, EOS = (0, "<unk>"), (1, "<s>"), (2, "</s>")
SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16"}
# Our per-layer parameters and the modules of Qwen3 and Llama that hold them (Llama has no q_norm, k_norm).
LAYER_MODULES = {"attn_norm": "input_layernorm", "wq": "self_attn.q_proj", "wk": "self_attn.k_proj",
                 "wv": "self_attn.v_proj", "q_gain": "self_attn.q_norm", "k_gain": "self_attn.k_norm",
                 "wo": "self_attn.o_proj", "mlp_norm": "post_attention_layernorm", "w1": "mlp.gate_proj",
                 "w3": "mlp.up_proj", "w2": "mlp.down_proj"}
QWEN3, LLAMA = "Qwen3ForCausalLM", "LlamaForCausalLM"


class ExportError(UserError):
    """A checkpoint or tokenizer that cannot be exported; the message is one line."""


def shortest_float32(x):
    """The shortest decimal that reads back as the same float32 as x: the checkpoint's norm_eps,
    9.99999974738e-06 as a double, is written 1e-05."""
    return float(str(np.float32(x)))


def architecture(c):
    """Qwen3 for the variants that normalise queries and keys, Llama for the one that does not."""
    return LLAMA if c.qk_norm == "none" else QWEN3


def rope_settings(c):
    """(rope_scaling, rope_parameters): transformers 4 reads rope_theta and rope_scaling (None or Llama 3's
    frequency scaling), transformers 5 rope_parameters."""
    theta = shortest_float32(c.rope_theta)
    if not c.rope_factor:
        return None, {"rope_type": "default", "rope_theta": theta}
    scaling = {"rope_type": "llama3", "factor": shortest_float32(c.rope_factor),
               "low_freq_factor": shortest_float32(c.rope_low_freq_factor),
               "high_freq_factor": shortest_float32(c.rope_high_freq_factor),
               "original_max_position_embeddings": c.rope_original_max_pos}
    return scaling, dict(scaling, rope_theta=theta)


def hf_config(c, dtype, with_tokenizer):
    """config.json of a Qwen3ForCausalLM or LlamaForCausalLM computing exactly the model of configuration c."""
    rope_scaling, rope_parameters = rope_settings(c)
    config = {
        "architectures": [architecture(c)], "model_type": "llama" if architecture(c) == LLAMA else "qwen3",
        "vocab_size": c.vocab_size, "hidden_size": c.d_model, "intermediate_size": c.d_ff,
        "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head, "num_key_value_heads": c.n_kv_head,
        "head_dim": c.head_dim, "hidden_act": "silu", "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": shortest_float32(c.norm_eps), "rope_theta": shortest_float32(c.rope_theta),
        "rope_scaling": rope_scaling, "rope_parameters": rope_parameters,
        "tie_word_embeddings": c.tied_embeddings, "attention_bias": False, "attention_dropout": 0.0,
    }
    if architecture(c) == LLAMA:
        config["mlp_bias"] = False
    else:  # every layer attends to the whole causal context
        config.update({"use_sliding_window": False, "sliding_window": None, "max_window_layers": c.n_layer,
                       "layer_types": ["full_attention"] * c.n_layer})
    config.update({"initializer_range": 0.02, "use_cache": True, "torch_dtype": dtype,
                   "bos_token_id": BOS[0] if with_tokenizer else None, "eos_token_id": EOS[0] if with_tokenizer else None,
                   "pad_token_id": None})
    return config


def tokenizer_config(c):
    """tokenizer_config.json: SentencePiece's own encoding of the text, with BOS in front as in training."""
    return {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
            "unk_token": UNK[1], "bos_token": BOS[1], "eos_token": EOS[1], "pad_token": None,
            "legacy": True, "clean_up_tokenization_spaces": False, "model_max_length": c.max_seq_len}


def hf_shapes(config):
    """The shape of every tensor of a Qwen3ForCausalLM or LlamaForCausalLM, from its config alone
    (a torch.nn.Linear(n_in, n_out) holds a weight [n_out, n_in]); lm_head only when untied."""
    V, C, F, D = config["vocab_size"], config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * D, config["num_key_value_heads"] * D
    layer = {"input_layernorm": [C], "self_attn.q_proj": [q, C], "self_attn.k_proj": [kv, C],
             "self_attn.v_proj": [kv, C], "self_attn.q_norm": [D], "self_attn.k_norm": [D],
             "self_attn.o_proj": [C, q], "post_attention_layernorm": [C], "mlp.gate_proj": [F, C],
             "mlp.up_proj": [F, C], "mlp.down_proj": [C, F]}
    if config["architectures"] == [LLAMA]:
        del layer["self_attn.q_norm"], layer["self_attn.k_norm"]
    shapes = {"model.embed_tokens.weight": [V, C]}
    for i in range(config["num_hidden_layers"]):
        shapes.update({f"model.layers.{i}.{module}.weight": shape for module, shape in layer.items()})
    shapes["model.norm.weight"] = [C]
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = [V, C]
    return shapes


def hf_state_dict(c, params):
    """Our parameters under their Hugging Face names, in layout order. Both store matrices as
    [out, in]; lm_head is written when untied (else it is the embedding). The gains of --qk-norm
    plain are the 1s that variant computes with, whatever the checkpoint holds there; --qk-norm none
    has none (Llama)."""
    tensors = {"model.embed_tokens.weight": params["wte"]}
    for i in range(c.n_layer):
        for ours, module in LAYER_MODULES.items():
            if c.qk_norm == "none" and ours in GAINS:
                continue
            tensor = params[f"layers.{i}.{ours}"]
            unused_gain = c.qk_norm == "plain" and ours in GAINS
            tensors[f"model.layers.{i}.{module}.weight"] = tensor.new_ones(tensor.shape) if unused_gain else tensor
    tensors["model.norm.weight"] = params["final_norm"]
    if not c.tied_embeddings:
        tensors["lm_head.weight"] = params["lm_head"]
    return tensors


def bfloat16_bits(x):
    """The bfloat16 bit patterns (uint16) of float32 values, rounded to nearest, ties to even."""
    bits = np.ascontiguousarray(x, dtype="<f4").view("<u4").astype(np.uint64)
    # Adding 0x7FFF plus the lowest kept bit carries into the kept half exactly when the dropped
    # half is above 0x8000, or equal to it and the kept half is odd.
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    quiet_nan = (bits >> 16) | 0x40  # a carry could turn a NaN into infinity
    return np.where(np.isnan(x), quiet_nan, rounded).astype("<u2")


def write_atomically(path, write_to):
    """Calls write_to(file) on path.tmp, then renames it to path; on failure removes path.tmp."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            write_to(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_safetensors(path, tensors, dtype="float32"):
    """A safetensors file of {name: tensor}: u64 header length N, N bytes of JSON header naming each
    tensor's dtype, shape and [begin, end) in the data, then the little-endian data, in order."""
    arrays = {name: t.detach().cpu().float().numpy() for name, t in tensors.items()}
    if dtype == "bfloat16":
        encode, itemsize = bfloat16_bits, 2
    else:
        encode, itemsize = (lambda a: a.astype("<f4")), 4
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, a in arrays.items():
        header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.size * itemsize]}
        offset += a.size * itemsize
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)  # spaces, so that the data starts 8-byte aligned

    def write_to(f):
        f.write(struct.pack("<Q", len(text)) + text)
        for a in arrays.values():
            f.write(encode(a).tobytes())

    write_atomically(path, write_to)


def write_json(path, value):
    write_atomically(path, lambda f: f.write((json.dumps(value, indent=2) + "\n").encode()))


def find_tokenizer(ckpt, given):
    """--tokenizer, else tokenizer.model beside the checkpoint, else the default corpus's; or None."""
    if given is not None:
        if not os.path.isfile(given):
            raise ExportError(f"{given}: no such tokenizer file")
        return given
    beside = os.path.join(os.path.dirname(os.path.abspath(ckpt)), "tokenizer.model")
    return next((path for path in (beside, DEFAULT_TOKENIZER) if os.path.isfile(path)), None)


def tokenizer_pieces(path):
    """The number of pieces of a SentencePiece model, or None where sentencepiece is not installed."""
    try:
        import sentencepiece
    except ImportError:
        return None
    try:
        return sentencepiece.SentencePieceProcessor(model_file=path).vocab_size()
    except (RuntimeError, OSError):
        raise ExportError(f"{path}: not a SentencePiece model") from None


def export(ckpt, outdir, dtype="float32", tokenizer=None):
    """Writes the Hugging Face export of the checkpoint ckpt into outdir; returns the summary line.
    Raises a UserError (CheckpointError, ExportError: a bad input) or an OSError (an unwritable outdir)."""
    c, params, _ = read_checkpoint(ckpt)
    tokenizer = find_tokenizer(ckpt, tokenizer)
    pieces = tokenizer_pieces(tokenizer) if tokenizer else None
    config = hf_config(c, dtype, tokenizer is not None)
    tensors = hf_state_dict(c, params)
    expected = hf_shapes(config)
    for name, tensor in tensors.items():
        if list(tensor.shape) != expected[name]:
            raise ExportError(f"{ckpt}: {name} is {list(tensor.shape)}, {architecture(c)} expects {expected[name]}")

    os.makedirs(outdir, exist_ok=True)
    written = ["model.safetensors"]
    write_safetensors(os.path.join(outdir, "model.safetensors"), tensors, dtype)
    if tokenizer:
        try:
            with open(tokenizer, "rb") as f:
                model = f.read()
        except OSError as e:
            raise ExportError(f"{tokenizer}: cannot read ({e.strerror})") from None
        write_atomically(os.path.join(outdir, "tokenizer.model"), lambda f: f.write(model))
        write_json(os.path.join(outdir, "tokenizer_config.json"), tokenizer_config(c))
        written += ["tokenizer.model", "tokenizer_config.json"]
    else:
        print(f"export_hf: no tokenizer exported: no --tokenizer given, and neither tokenizer.model beside "
              f"the checkpoint nor {DEFAULT_TOKENIZER} exists")
    write_json(os.path.join(outdir, "config.json"), config)
    written.append("config.json")
    if pieces is not None and pieces > c.vocab_size:
        print(f"warning: {tokenizer} has {pieces} pieces and the model {c.vocab_size} embeddings: "
              f"ids from {c.vocab_size} on cannot be fed to it", file=sys.stderr)
    count = sum(t.numel() for t in tensors.values())
    return f"export_hf: wrote {', '.join(written)} to {outdir}: {architecture(c)}, {dtype}, {count:,} parameters"


def main(argv=None):
    """The command line: its exit status (attnlog.commands)."""
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ckpt", help="a checkpoint of ./train (docs/checkpoint_format.md)")
    parser.add_argument("outdir", help="the folder to write the export into (created if missing)")
    parser.add_argument("--dtype", choices=sorted(SAFETENSORS_DTYPES), default="float32",
                        help="the type of the exported weights (default float32)")
    parser.add_argument("--tokenizer", metavar="FILE", help="the run's SentencePiece tokenizer.model (default: "
                        "the one beside the checkpoint, else data/brown/tokenizer.model)")
    return run(lambda args: print(export(args.ckpt, args.outdir, args.dtype, args.tokenizer)), parser.parse_args, argv)
