#!/usr/bin/env python3
"""The longest functions of train_gpt.cu and llmc/, in lines from the first line of the signature
to the closing brace: a rough reading of the code's shape, not a parser.

    dev/function_lengths.py [N]     the N longest (10)
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_NAMES = {"__launch_bounds__", "if", "for", "while", "switch", "sizeof", "decltype", "alignas"}


def functions(path):
    """(lines, name, first line) of each function defined at the top level of the file."""
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        starts = line and not line[0].isspace() and "(" in line and "=" not in line.split("(")[0]
        if starts and not line.startswith(("#", "//", "struct", "enum", "static const", "using", "}")):
            j = i
            while j < len(lines) and "{" not in lines[j] and not lines[j].rstrip().endswith(";"):
                j += 1
            if j < len(lines) and "{" in lines[j]:
                names = [n for n in re.findall(r"([A-Za-z_]\w*)\s*\(", " ".join(lines[i:j + 1])) if n not in NOT_NAMES]
                depth, k = 0, j
                while k < len(lines):
                    depth += lines[k].count("{") - lines[k].count("}")
                    if depth <= 0:
                        break
                    k += 1
                yield k - i + 1, names[0] if names else "?", i + 1
                i = k
        i += 1


def main():
    most = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    files = [ROOT / "train_gpt.cu"] + sorted((ROOT / "llmc").glob("*.h")) + sorted((ROOT / "llmc").glob("*.cuh"))
    found = [(n, name, f"{f.relative_to(ROOT)}:{line}") for f in files for n, name, line in functions(f)]
    for n, name, where in sorted(found, key=lambda x: -x[0])[:most]:
        print(f"{n:5d}  {name}  {where}")


if __name__ == "__main__":
    main()
