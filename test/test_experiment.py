"""Tests of scripts/experiment.py (attnlog.experiment): a folder of runs gathered into configurations
and seeds, on small run logs written here whose every value is set here, so that each mean, spread
and count the command gives has a right answer computed here from those values; and the tables that
docs/research.md quotes, made again from the runs kept in docs/runs/d22.

    /usr/bin/python3 -m pytest -q test/test_experiment.py
"""
import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from attnlog import analysis, commands, experiment, reader
from tolerance import close

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "experiment.py"
KEPT = ROOT / "docs" / "runs" / "d22"
RESEARCH = ROOT / "docs" / "research.md"
# The section of docs/research.md whose tables are quoted from KEPT's report/results.md.
QUOTED_SECTION = "## The d22 runs"

# The constructed runs: 6 layers (early 0-1, middle 2-3, final 4-5) of 2 heads, head_dim 64 as in the
# notes (their magnitudes apply), 1000 steps of 8192 tokens, statistics every 50 steps and at the
# last; training shards of 819,200 tokens, so the first pass ends at step 100, a stats step.
LAYERS, HEADS, D, T = 6, 2, 64, 64
STEPS, TOKENS_PER_STEP, TRAIN_TOKENS = 1000, 8192, 819200
STATS_STEPS = np.array(list(range(0, STEPS, 50)) + [STEPS - 1])
FIRST_PASS_STEP = 100
EARLY, MIDDLE, FINAL = [0, 1], [2, 3], [4, 5]
# Each configuration: its QK-norm index and options, and per seed (the early and the final layers' key
# norm at the last stats step, the training loss of every step, the validation loss at the end).
CONFIGS = {
    "gain": (0, {"qk-norm": "gain", "decay": "matrices"},
             {1337: (5.0, 9.0, 4.9, 5.1), 42: (5.5, 10.0, 5.0, 5.2), 7: (6.5, 11.5, 5.05, 5.3)}),
    "plain": (1, {"qk-norm": "plain", "decay": "matrices"},
              {1337: (8.0, 8.0, 4.95, 5.15), 42: (8.0, 8.0, 5.0, 5.1)}),
    "decay_all": (0, {"qk-norm": "gain", "decay": "all"},
                  {1337: (7.0, 8.0, 4.9, 5.0), 42: (7.6, 8.4, 5.1, 5.25)}),
}
# The log holds float32 values: one rounding, 2^-24 relative, and the means of a few of them.
LOGGED = dict(rtol=1e-6, atol=1e-6)
FIRST_PASS_OFFSET, LATER_OFFSET = 1.0, 0.12  # a learnt key norm's distance from its end value then
# The telemetry the report reads, by the dimension of its columns (docs/telemetry.md).
METRICS = {"kv_head": ["k_norm", "k_maxabs", "k_pr", "k_cos", "k_erank", "k_mean_share", "k_erank_centered"],
           "q_head": ["q_norm", "attn_entropy", "attn_sink", "attn_doc_start", "attn_maxp", "attn_logit_max"],
           "dim": ["g_q", "g_k"]}
COLUMNS_OF = {name: dim for dim, names in METRICS.items() for name in names}


# -- run logs written as docs/log_format.md lays them out ----------------------------------------------


def key_norm_curve(end, learnt):
    """[S] a layer's mean key norm: sqrt(D) at step 0; with learnt gains end + FIRST_PASS_OFFSET up to
    the end of the first pass, end + LATER_OFFSET after it, end at the last stats step; else end."""
    if not learnt:
        return np.full(len(STATS_STEPS), end)
    curve = np.where(STATS_STEPS <= FIRST_PASS_STEP, end + FIRST_PASS_OFFSET, end + LATER_OFFSET)
    curve[0], curve[-1] = 8.0, end
    return curve


def key_norms(early, final, learnt):
    """[S, L, 2]: each layer's two kv heads 0.25 below and above its curve (the layer's mean)."""
    per_layer = np.empty((len(STATS_STEPS), LAYERS))
    for layers, end in ((EARLY, early), (MIDDLE, 9.0), (FINAL, final)):
        per_layer[:, layers] = key_norm_curve(end, learnt)[:, None]
    return per_layer[:, :, None] + np.array([-0.25, 0.25])


def telemetry(early, final, learnt):
    """{metric: [S, L, cols]}: the key norms above; every other metric plain constants."""
    sizes = {"kv_head": HEADS, "q_head": HEADS, "dim": D}
    tables = {name: np.full((len(STATS_STEPS), LAYERS, sizes[dim]), 1.0 if name.startswith("g_") else 0.5)
              for name, dim in COLUMNS_OF.items()}
    tables["k_norm"] = key_norms(early, final, learnt)
    tables["attn_entropy"][:] = 0.7 * analysis.uniform_entropy(T)
    tables["attn_sink"][:] = 0.02
    tables["k_pr"][:] = 22.0
    return tables


def field(name, shape, dims):
    return {"name": name, "dtype": "float32", "shape": shape, "dims": dims}


def header(seed, qk_norm, options, tables):
    """The log's header: the model, the options, and the record table, whose telemetry fields are
    tables' in their order (the order of the payload)."""
    telemetry_fields = [field(name, list(table.shape[1:]), ["layer", COLUMNS_OF[name]])
                        for name, table in tables.items()]
    return {"format": "attnlog", "version": 1, "created": "2026-01-01T00:00:00Z",
            "config": {"vocab_size": 256, "n_layer": LAYERS, "n_head": HEADS, "n_kv_head": HEADS, "head_dim": D,
                       "d_model": HEADS * D, "d_ff": 256, "max_seq_len": T, "rope_theta": 10000.0,
                       "norm_eps": 1e-05, "qk_norm": qk_norm, "tied_embeddings": 1},
            "options": dict({"batch": "4", "seq-len": str(T), "total-batch": str(TOKENS_PER_STEP),
                             "steps": str(STEPS), "warmup": "40", "stats-every": "50", "freeze": "",
                             "seed": str(seed), "out": f"runs/{seed}"}, **options),
            "seed": seed, "backend": "cpu", "device": "constructed", "num_processes": 1,
            "train_tokens": TRAIN_TOKENS,
            "records": [{"type": 1, "name": "step", "fields": [field("loss", [], []), field("lr", [], [])]},
                        {"type": 2, "name": "val", "fields": [field("val_loss", [], [])]},
                        {"type": 3, "name": "telemetry", "fields": telemetry_fields}]}


def write_log(path, seed, qk_norm, options, early, final, loss, val_loss):
    """A run log of STEPS steps: the training loss and the learning rate of every step, the validation
    loss at the last, and the telemetry at STATS_STEPS."""
    tables = telemetry(early, final, learnt=qk_norm == 0)
    text = json.dumps(header(seed, qk_norm, options, tables)).encode()
    records = []
    for step in range(STEPS):
        records.append(reader.frame_record(1, step, struct.pack("<ff", loss, 0.003)))
        if step in STATS_STEPS:
            i = int(np.searchsorted(STATS_STEPS, step))
            payload = b"".join(table[i].astype("<f4").tobytes() for table in tables.values())
            records.append(reader.frame_record(3, step, payload))
    records.append(reader.frame_record(2, STEPS - 1, struct.pack("<f", val_loss)))
    data = b"ATTNLOG\0" + struct.pack("<III", 1, len(text), zlib.crc32(text)) + text + b"".join(records)
    path.write_bytes(reader.xz_compressed(data) if path.suffix == ".xz" else data)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The runs of CONFIGS, one folder each named <configuration>_seed<N>; the first seed of each
    kept as run.attnlog.xz with a MANIFEST, the others as run.attnlog without."""
    root = tmp_path_factory.mktemp("experiment") / "runs"
    for name, (qk_norm, options, seeds) in CONFIGS.items():
        for n, (seed, (early, final, loss, val_loss)) in enumerate(seeds.items()):
            sub = root / f"{name}_seed{seed}"
            sub.mkdir(parents=True)
            write_log(sub / ("run.attnlog.xz" if n == 0 else "run.attnlog"), seed, qk_norm, options, early, final,
                      loss, val_loss)
            if n == 0:
                (sub / "MANIFEST").write_text(f"command: ./train --seed {seed}\ncommit: commit 0123abc\n")
    probes = root / "gain_seed42" / "probes"
    probes.mkdir()
    for probe, numbers in PROBED.items():
        (probes / f"{probe}.json").write_text(json.dumps(dict(numbers, probe=probe, checkpoint="model.ckpt")))
    return root


# The probes' JSON (scripts/probe.py --json) kept with one run, gain_seed42: a sweep of three scales;
# svd with layer l's head h at the effective rank 2 l + h (layer 0's head 0 NaN, as JSON's null);
# ablate with the increase 0.01 (l + 1) + 0.001 h zeroed, 0.005 less mean-ablated.
SWEEP_SCALES, SWEEP_LOSS, SWEEP_SE = [0.5, 1, 2], [5.5, 5.0, 5.2], [0.01, 0.0, 0.02]
ERANK = [[None if (l, h) == (0, 0) else 2.0 * l + h for h in range(HEADS)] for l in range(LAYERS)]
INCREASE = [[0.01 * (l + 1) + 0.001 * h for h in range(HEADS)] for l in range(LAYERS)]
PROBED = {
    "sweep": {"scales": SWEEP_SCALES, "loss": SWEEP_LOSS, "loss_change_se": SWEEP_SE, "sequences": 8, "seq_len": T},
    "svd": {"effective_rank": ERANK, "cos_mean": [[0.25] * HEADS] * LAYERS, "chance_cos_mean": 0.125,
            "chance_cos_mean_se": 0.002, "qk_row_cos_abs_mean": [[0.1] * HEADS] * LAYERS,
            "chance_qk_row_cos_abs_mean": 0.05, "chance_qk_row_cos_abs_mean_se": 0.001},
    "ablate": {"loss": 5.0, "loss_se": 0.03, "increase": INCREASE, "increase_se": [[0.002] * HEADS] * LAYERS,
               "mean_increase": [[x - 0.005 for x in row] for row in INCREASE],
               "mean_increase_se": [[0.001] * HEADS] * LAYERS, "sequences": 8},
}


def experiment_py(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="module")
def made(folder):
    """The command on the folder, its output in the default place: (results.json, results.md, stdout)."""
    result = experiment_py(folder)
    assert result.returncode == 0, result.stderr
    out = folder / "report"
    return json.loads((out / "results.json").read_text()), (out / "results.md").read_text(), result.stdout


def configuration(results, name):
    return next(c for c in results["configurations"] if c["name"] == name)


def claim(config, claim_id):
    return next(row for row in config["claims"] if row["id"] == claim_id)


def sd(values):
    """The sample standard deviation, n - 1 in the denominator."""
    values = np.asarray(values, float)
    return float(np.sqrt(((values - values.mean()) ** 2).sum() / (len(values) - 1)))


def table_row(text, heading, first_cell):
    """The cells of the row that starts with first_cell in the first table after heading."""
    section = text[text.index(heading):]
    line = next(line for line in section.splitlines() if line.startswith(f"| {first_cell} |"))
    return [cell.strip() for cell in line.strip("|").split(" | ")]


# -- the tests --------------------------------------------------------------------------------------


def test_runs_grouped_into_configurations(made):
    """Runs that differ only in the seed are one configuration, named by their folders, the default
    (learnt gains, decay on the matrices) first; every run counted, with its seed and MANIFEST."""
    results, text, stdout = made
    assert [c["name"] for c in results["configurations"]] == ["gain", "plain", "decay_all"]
    for name, (_, _, seeds) in CONFIGS.items():
        c = configuration(results, name)
        # by their numbers (7, 42, 1337), not their text (1337, 42, 7)
        assert c["seeds"] == sorted(seeds) and c["runs"] == [f"{name}_seed{s}" for s in c["seeds"]]
    logs = {run["label"]: run["log"] for run in results["runs"]}
    assert logs["gain_seed1337"] == "gain_seed1337/run.attnlog.xz" and logs["gain_seed42"] == "gain_seed42/run.attnlog"
    assert table_row(text, "## The runs", "gain_seed1337")[4] == "commit 0123abc"
    assert table_row(text, "## The runs", "gain_seed42")[4] == "not recorded"
    assert "7 runs in 3 configurations" in stdout


@pytest.mark.parametrize("name", CONFIGS)
def test_claims_over_the_seeds(made, name):
    """The early layers' key norm of "about 5.3" and the final layers' of "about 9.8" after 1000 steps:
    each seed's value at the last stats step, their mean, sd and range, and in how many seeds each is
    within 10% of the note's value, as this test reckons them from the values it wrote."""
    results, text, _ = made
    seeds = CONFIGS[name][2]
    c = configuration(results, name)
    for claim_id, column, note in (("early-norm-5.3", 0, 5.3), ("final-norm-9.8", 1, 9.8)):
        ends = [v[column] for v in seeds.values()]
        row = claim(c, claim_id)
        assert row["values"] == {f"{name}_seed{s}": [close(v[column], **LOGGED)] for s, v in seeds.items()}
        assert row["steps"] == [STEPS - 1]
        assert row["mean"] == [close(np.mean(ends), **LOGGED)]
        assert row["sd"] == [close(sd(ends), **LOGGED)]
        assert row["low"] == [close(min(ends), **LOGGED)] and row["high"] == [close(max(ends), **LOGGED)]
        within = sum(abs(v / note - 1) <= 0.1 for v in ends)
        assert (row["reproduced"], row["decided"]) == (within, len(ends))
        assert table_row(text, f"### {name}: ", row["claim"])[-1] == f"{within} of {len(ends)}"


def test_gain_claims_do_not_apply_without_learnt_gains(made):
    """plain holds its gains at 1: the claims about the order of the key gains are not applicable to
    it, while they are decided in the configurations that learn them."""
    results, text, _ = made
    for claim_id in ("coordinates-fixed-by-200", "golden-dimensions"):
        assert claim(configuration(results, "plain"), claim_id)["outcome"] == "not applicable"
        assert claim(configuration(results, "gain"), claim_id)["decided"] == 3
    golden = claim(configuration(results, "gain"), "golden-dimensions")["claim"]
    row = table_row(text, "### Every configuration", golden)
    assert row[2] == "not applicable" and row[1].endswith(" of 3)")


def window_means(early_or_final, name):
    """Each seed's mean of a layer group's key norm over the decision window (the stats steps in the
    last quarter of the span from the first to the last), from the curve this test wrote."""
    _, _, seeds = CONFIGS[name]
    window = STATS_STEPS >= STATS_STEPS[-1] - 0.25 * (STATS_STEPS[-1] - STATS_STEPS[0])
    column = {"early": 0, "final": 1}[early_or_final]
    return [float(key_norm_curve(v[column], CONFIGS[name][0] == 0)[window].mean()) for v in seeds.values()]


@pytest.mark.parametrize("name", CONFIGS)
def test_statistics_side_by_side(made, name):
    """The configurations' decision-window means over the seeds: mean, sd and range, and the cell of
    the table; the losses and their gap likewise."""
    results, text, _ = made
    numbers = configuration(results, name)["numbers"]
    for group in ("early", "final"):
        means = window_means(group, name)
        got = numbers["statistics"]["k_norm"][group]
        assert got["mean"] == close(np.mean(means), **LOGGED) and got["n"] == len(means)
        assert got["sd"] == close(sd(means), **LOGGED)
        assert got["low"] == close(min(means), **LOGGED) and got["high"] == close(max(means), **LOGGED)
    column = [c["name"] for c in results["configurations"]].index(name) + 1
    cell = table_row(text, "## The configurations side by side", "key norm, final (layers 4-5)")[column]
    final = window_means("final", name)
    assert cell == f"{np.mean(final):#.3g} \u00b1 {sd(final):#.3g}"
    seeds = CONFIGS[name][2].values()
    gaps = [v[3] - v[2] for v in seeds]
    assert numbers["val_loss"]["mean"] == close(np.mean([v[3] for v in seeds]), **LOGGED)
    assert numbers["gap"]["mean"] == close(np.mean(gaps), **LOGGED)
    assert numbers["gap"]["sd"] == close(sd(gaps), **LOGGED)


def test_first_pass_beside_the_end(made):
    """The stats step nearest the end of the first pass over the training tokens (step 100 here) and
    the key norms there, beside those at the last stats step, over the seeds."""
    results, text, _ = made
    numbers = configuration(results, "gain")["numbers"]
    seeds = CONFIGS["gain"][2].values()
    assert numbers["first_pass"]["steps"] == numbers["first_pass"]["stats_steps"] == [FIRST_PASS_STEP] * 3
    early = numbers["first_pass"]["k_norm"]["early"]
    assert early["first_pass"]["mean"] == close(np.mean([v[0] + FIRST_PASS_OFFSET for v in seeds]), **LOGGED)
    assert early["end"]["mean"] == close(np.mean([v[0] for v in seeds]), **LOGGED)
    assert numbers["passes"]["mean"] == close(STEPS * TOKENS_PER_STEP / TRAIN_TOKENS, rtol=1e-12)
    assert table_row(text, "## Repetition of the training data", "gain")[2] == f"{FIRST_PASS_STEP} ({FIRST_PASS_STEP})"


def test_dampened_early_keys_counted(made):
    """The early layers' window means more than 5% below sqrt(D) = 8, in how many seeds (decay_all's
    seed 42 ends at 7.6, but its window mean lies above 7.6)."""
    _, text, _ = made
    for name in CONFIGS:
        below = sum(m < 8 * 0.95 for m in window_means("early", name))
        assert table_row(text, "**Dampened early keys.**", name)[2] == f"{below} of {len(CONFIGS[name][2])}"


def test_probes_of_a_run(made):
    """The probes a run's folder keeps, in results.md: the sweep's loss changes against s = 1, svd's
    effective rank averaged over each layer group's heads (NaN left out) and its cosines beside
    chance, ablate's group means and the three heads whose zeroing costs most."""
    results, text, _ = made
    assert [p["run"] for p in results["probes"]] == ["gain_seed42"] and results["probes"][0]["configuration"] == "gain"
    sweep = table_row(text, "**Attention logits times s**", "gain_seed42")
    assert sweep == ["gain_seed42", "gain", f"8 x {T}", "5.0000", "+0.5000 ± 0.0100", "+0.2000 ± 0.0200"]
    svd = table_row(text, "**The heads' score forms**", "gain_seed42")
    ranks = [np.mean([x for l in layers for x in ERANK[l] if x is not None]) for layers in (EARLY, MIDDLE, FINAL)]
    assert ranks[0] == 2.0  # heads (0, 1), (1, 0), (1, 1): 1, 2, 3
    assert svd == ["gain_seed42", "gain"] + [f"{r:.1f}" for r in ranks] + \
        ["0.250 (chance 0.125 ± 0.002)", "0.100 (chance 0.050 ± 0.001)"]
    ablate = table_row(text, "**Each head removed**", "gain_seed42")
    zeroed = [np.mean([INCREASE[l] for l in layers]) for layers in (EARLY, MIDDLE, FINAL)]
    assert ablate == ["gain_seed42", "gain", "5.0000 ± 0.0300"] + [f"{m:+.4f}" for m in zeroed] + \
        [f"{m - 0.005:+.4f}" for m in zeroed] + \
        ["5.1 (+0.0610 ± 0.0020), 5.0 (+0.0600 ± 0.0020), 4.1 (+0.0510 ± 0.0020)"]


def test_figures_drawn(made, folder):
    for name in ("key_norm.png", "attn_entropy.png"):
        assert (folder / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_errors_in_one_line(tmp_path):
    for args, part in (([tmp_path / "missing"], "no such folder"), ([tmp_path], "no subfolder holds")):
        result = experiment_py(*args)
        assert result.returncode == commands.USER_ERROR and "Traceback" not in result.stderr
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1 and part in result.stderr


# -- the kept runs and docs/research.md ------------------------------------------------------------


def quoted_tables(text):
    """The Markdown tables of docs/research.md's section QUOTED_SECTION, each a list of its lines."""
    section = text[text.index(QUOTED_SECTION):]
    end = section.find("\n## ", len(QUOTED_SECTION))
    tables, current = [], []
    for line in (section if end < 0 else section[:end]).splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables + ([current] if current else [])


def test_research_quotes_the_kept_results(tmp_path):
    """results.md made again from the kept logs is the one kept beside them, and every table of
    docs/research.md's section on those runs quotes one of its tables: the same header, and rows of
    that table as it has them (some of its rows may be left out)."""
    experiment.make_experiment(KEPT, tmp_path)
    kept = (KEPT / "report" / "results.md").read_text()
    assert (tmp_path / "results.md").read_text() == kept
    tables = quoted_tables(RESEARCH.read_text())
    assert tables
    lines = kept.splitlines()
    for table in tables:
        start = lines.index(table[0])
        end = lines.index("", start)
        rows = lines[start:end]
        assert table[1] == rows[1] and all(row in rows for row in table[2:]), table[0]
