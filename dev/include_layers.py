#!/usr/bin/env python3
"""The headers of llmc/ in layers, and their include graph: a header includes headers of its own
layer or of lower ones, never of a higher one.

    dev/include_layers.py           prints the graph, layer by layer; exits 1 on a violation
    dev/include_layers.py --check   prints only the violations (make test runs it)

A header missing from LAYERS, or one listed that no longer exists, is an error too.
"""
import re
import sys
from pathlib import Path

LLMC = Path(__file__).resolve().parent.parent / "llmc"

# Lowest first.
LAYERS = [
    ("foundations: errors and files, numbers, JSON",
     ["utils.h", "math.h", "eigen.h", "rand.h", "json.h"]),
    ("the machine and the data: devices, processes, libraries, memory, tokens, weight files",
     ["cuda_common.cuh", "cuda_graph.cuh", "distributed.h", "dynamic_library.h", "memory.h", "tokenizer.h", "dataloader.h", "safetensors.h"]),
    ("the model's description: configuration and parameters, buffers, the statistics' sums, files",
     ["config.h", "telemetry_sums.h", "activations.h", "checkpoint.h", "hf_checkpoint.h", "dataprep.h"]),
    ("computing: the statistics, the backend contract, the CPU backend, the GPU kernels",
     ["telemetry.h", "backend.h", "model_cpu.h", "matmul.cuh", "rmsnorm.cuh", "qknorm_rope.cuh", "attention.cuh",
      "cudnn_attention.cuh",
      "swiglu.cuh", "encoder.cuh", "classifier.cuh", "adamw.cuh", "nccl.cuh", "telemetry.cuh"]),
    ("the run: options, the log, resuming, the run folder",
     ["options.h", "runlog.h", "runlog_scan.h", "runlog_append.h", "resume.h", "run_dir.h"]),
]

INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)


def main():
    check_only = "--check" in sys.argv[1:]
    layer_of = {name: k for k, (_, names) in enumerate(LAYERS) for name in names}
    present = {p.name for p in LLMC.iterdir() if p.suffix in (".h", ".cuh")}
    problems = [f"llmc/{n}: in no layer of dev/include_layers.py" for n in sorted(present - set(layer_of))]
    problems += [f"llmc/{n}: listed in dev/include_layers.py, but there is no such header" for n in sorted(set(layer_of) - present)]
    for k, (what, names) in enumerate(LAYERS):
        if not check_only:
            print(f"layer {k}, {what}:")
        for name in names:
            if name not in present:
                continue
            includes = INCLUDE.findall((LLMC / name).read_text())
            for inc in includes:
                if inc in layer_of and layer_of[inc] > k:
                    problems.append(f"llmc/{name} (layer {k}) includes {inc}, of the higher layer {layer_of[inc]}")
            if not check_only:
                print(f"  {name}: {' '.join(includes) if includes else '-'}")
    for p in problems:
        print("error:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
