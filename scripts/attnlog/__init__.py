"""The Python side of the trainer: its run log read (numpy only), and the report, the probes and
the export built on it.

    import attnlog
    log = attnlog.open_log("runs/X/run.attnlog")
    steps, k_norm = log.metric("k_norm")       # k_norm[s, layer, kv_head]
    steps, loss = log.scalars("loss")

Modules (docs/log_format.md, docs/telemetry.md, docs/research.md):
    reader       the log reader and its command line (`attnlog`); its names are the package's own
    layout       the names of the model's parameter kinds and QK-norm variants (llmc/config.h)
    commands     what every command does with an error
    analysis     a run loaded into numpy arrays, the quantities derived from it, the statistics
    verdicts     the research reports' hypotheses decided on a run, the head taxonomy, replicates
    summary      summary.json: every number of a run's report
    figures, run_figures   the figures and their captions
    document     the report as Markdown and as one self-contained HTML page
    report       the report of run logs (`attnlog-report`)
    model_torch  the model in PyTorch and the checkpoint reader (needs torch)
    probe        probes of a checkpoint's heads (`attnlog-probe`; needs torch)
    export_hf    the Hugging Face export of a checkpoint (`attnlog-export-hf`; needs torch)
    bpe          Hugging Face byte-level BPE tokenizers, tokenizer.json (needs regex)
    tokenize_hf  their token shards for ./train, encoding, decoding (`attnlog-tokenize-hf`)
"""
from attnlog.reader import EXPORT_COLUMNS, LogError, RecordType, RunLog, long_table, open_log, run_labels, write_long

__all__ = ["EXPORT_COLUMNS", "LogError", "RecordType", "RunLog", "long_table", "open_log", "run_labels", "write_long"]
