"""The README's figures are those measured in docs/benchmarks.md, each with where it was measured.

    /usr/bin/python3 -m pytest -q test/test_docs.py
"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BENCHMARKS = (ROOT / "docs" / "benchmarks.md").read_text()

# A measured figure: a number with a unit of speed, time or share ("1.2x", "1.5%", "55.0 ms"), not a
# digit of a longer number or name.
FIGURE = re.compile(r"(?<![\w.,])\d+(?:[.,]\d+)*(?:x\b|%| ms\b| tokens/s\b| TFLOP/s\b| minutes?\b| hours?\b)")
# Numbers of the README that are no measurement.
NOT_MEASURED = {"95%"}  # the confidence level of the report's intervals across seeds
# Where a figure was measured: a machine or card, and the page with the details.
MACHINE = re.compile(r"\b(cores? of an? [A-Z]\w+|NVIDIA [A-Z]\d+)")
COMMIT = re.compile(r"\bcommit [0-9a-f]{7,40}\b")


def paragraphs(text):
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def figures(text):
    return {m.group() for m in FIGURE.finditer(text)} - NOT_MEASURED


def test_every_readme_figure_is_in_the_benchmarks():
    measured = figures(BENCHMARKS)
    claimed = figures(README)
    assert claimed, "no figures found in README.md: the pattern no longer matches how they are written"
    assert sorted(claimed - measured) == []


def test_every_readme_figure_says_where_it_was_measured():
    """Each paragraph with figures names the machine or card and the commit, and links the page."""
    for paragraph in paragraphs(README):
        if figures(paragraph):
            assert "docs/benchmarks.md" in paragraph, paragraph
            assert MACHINE.search(paragraph) and COMMIT.search(paragraph), paragraph


def test_benchmark_sections_name_their_commit():
    titles = [line for line in BENCHMARKS.splitlines() if line.startswith("## ")]
    assert titles and all(COMMIT.search(t) for t in titles), titles


def test_readme_commits_are_those_of_the_benchmarks():
    """A commit the README names for a figure is the commit its section of the benchmarks names."""
    named = set(COMMIT.findall(README))
    assert named and named <= set(COMMIT.findall(BENCHMARKS)), named


def test_readme_names_every_candidate():
    """The candidates the README says TRAIN_CANDIDATES_OFF takes are those the candidate build has
    (candidate_on's names in train_gpt.cu and llmc/)."""
    sources = [ROOT / "train_gpt.cu", *sorted((ROOT / "llmc").glob("*.cuh"))]
    built = {name for path in sources for name in re.findall(r'candidate_on\("(\w+)"\)', path.read_text())}
    said = re.search(r"`TRAIN_CANDIDATES_OFF`\s*\(names\s+separated\s+by\s+commas:\s+([^)]*)\)", README)
    assert said, "README.md no longer lists the candidates after TRAIN_CANDIDATES_OFF"
    assert set(re.findall(r"`(\w+)`", said.group(1))) == built
