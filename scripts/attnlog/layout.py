"""The names of the model's layout, as the trainer's llmc/config.h defines them, here once for every
Python module (plain Python: the log's readers use them without PyTorch).

CONFIG_FIELDS   the integer fields of ModelConfig, in the order of a checkpoint's header
LAYER_TENSORS   the parameter tensors of one layer, in layout order
PARAM_KINDS     ParamKind: every parameter kind in layout order; bit k of a frozen mask (a
                checkpoint's header) is kind k, --freeze names them (a log's options)
QK_NORMS        QkNorm: how queries and keys are normalised; a checkpoint's header and a log's
                config hold the index (docs/model.md, docs/checkpoint_format.md, docs/log_format.md)
GAINS           the kinds a variant other than gain holds at 1
MATRICES        the kinds that are matrices (AdamW decays their weights unless --decay says otherwise)
"""
CONFIG_FIELDS = ("vocab_size", "n_layer", "n_head", "n_kv_head", "head_dim", "d_model", "d_ff", "max_seq_len")
LAYER_TENSORS = ("attn_norm", "wq", "wk", "wv", "q_gain", "k_gain", "wo", "mlp_norm", "w1", "w3", "w2")
PARAM_KINDS = ("wte",) + LAYER_TENSORS + ("final_norm", "lm_head")  # lm_head: only when untied
QK_NORMS = ("gain", "plain", "none")
GAINS = ("q_gain", "k_gain")
MATRICES = ("wte", "wq", "wk", "wv", "wo", "w1", "w3", "w2", "lm_head")


def frozen_mask(kinds):
    """The bit mask of parameter kind names (--freeze)."""
    mask = 0
    for kind in kinds:
        mask |= 1 << PARAM_KINDS.index(kind)
    return mask


def decayed_kinds(decay="matrices"):
    """The names of the kinds that --decay's value (kinds and the groups matrices, gains and all,
    comma-separated; or none) has AdamW decay, in layout order; ValueError for a word that is
    neither a kind nor a group."""
    if decay == "none":
        return []
    groups = {"matrices": MATRICES, "gains": tuple(k for k in PARAM_KINDS if k not in MATRICES), "all": PARAM_KINDS}
    named = set()
    for word in decay.split(","):
        if word not in groups and word not in PARAM_KINDS:
            raise ValueError(f"--decay: {word or 'an empty name'!r} is not a parameter kind or a group")
        named.update(groups.get(word, (word,)))
    return [kind for kind in PARAM_KINDS if kind in named]


def frozen_kinds(mask, qk_norm="gain"):
    """The names of the kinds a frozen mask holds fixed, in layout order, with the gains the QK-norm
    variant holds at 1 (all a variant other than gain has)."""
    if qk_norm != "gain":
        mask |= frozen_mask(GAINS)
    return [kind for i, kind in enumerate(PARAM_KINDS) if mask >> i & 1]
