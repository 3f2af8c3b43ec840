"""Runs every test of the project and prints the summary line "N passed, N failed".

C++ test programs print one line per check ("PASS name" / "FAIL name: why"), which says which
fraction of its tolerance a comparison used; this prints the failures and the checks that used
half of their tolerance or more. pytest suites are counted from their JUnit report, and list every
comparison's margin at the end (test/conftest.py). Tests that need a GPU run only when one is
present; otherwise one line says they were skipped (cuDNN's attention graphs, which need its library
but no GPU, are finalised wherever the build has them). Each fuzzing harness of test/fuzz runs briefly from its seeds (one
line each), and the CPU tests and a short training run run again built with ASan and UBSan.
Run through `make test`, which builds what this runs first; `--only sanitize` runs the sanitizers'
part alone (`make sanitize`).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# How much of its tolerance a check used, as test/testing.h and test/tolerance.py print it.
USED = re.compile(r"uses (\d+(?:\.\d+)?|inf)% of its tolerance")


def run_cpp(name, argv, totals, env=None):
    """Counts a C++ program's PASS and FAIL lines; prints the failures, and the passing checks that
    used half of their tolerance or more."""
    print(f"== {name}: {' '.join(argv)}", flush=True)
    proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    passed = failed = 0
    for line in proc.stdout.splitlines():
        if line.startswith("PASS "):
            passed += 1
            used = USED.search(line)
            if used and float(used.group(1)) >= 50:
                print(line[:400])
        elif line.startswith("FAIL "):
            failed += 1
            print(line)
    if proc.returncode != 0 and failed == 0:  # crashed or failed outside a check
        failed += 1
        print(proc.stdout[-4000:])
        print(f"FAIL {name}: exited with status {proc.returncode}")
    print(f"   {passed} passed, {failed} failed", flush=True)
    totals[0] += passed
    totals[1] += failed


def run_pytest(files, totals):
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "junit.xml")
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *files]
        print(f"== pytest: {' '.join(files)}", flush=True)
        proc = subprocess.run(argv, cwd=ROOT)
        if not os.path.exists(report):
            totals[1] += 1
            print(f"FAIL pytest: no report (status {proc.returncode})")
            return
        passed = failed = 0
        for case in ET.parse(report).getroot().iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.find("skipped") is None:
                passed += 1
        totals[0] += passed
        totals[1] += failed


# The fuzzing harnesses' smoke runs: each for FUZZ_SMOKE_RUNS inputs or FUZZ_SMOKE_SECONDS,
# whichever comes first, with the options of `make fuzz` (the Makefile passes them).
FUZZ_HARNESSES = ("checkpoint", "shard", "runlog", "safetensors")
FUZZ_SMOKE_RUNS, FUZZ_SMOKE_SECONDS = 50000, 10


def run_fuzz_smoke(name, totals):
    options = os.environ.get("FUZZ_OPTIONS", "-max_len=65536 -malloc_limit_mb=64 -timeout=10").split()
    with tempfile.TemporaryDirectory() as corpus:
        argv = [f"build/fuzz/fuzz_{name}", f"-runs={FUZZ_SMOKE_RUNS}", f"-max_total_time={FUZZ_SMOKE_SECONDS}", "-seed=1",
                *options, f"-artifact_prefix={corpus}/", corpus, f"build/fuzz/seeds/{name}"]
        print(f"== fuzzing smoke run: {' '.join(argv)}", flush=True)
        proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = re.search(r"^Done (\d+) runs in (\d+) second", proc.stdout, re.M)
    if proc.returncode == 0 and done:
        totals[0] += 1
        print(f"PASS fuzz_{name}: {done.group(1)} inputs in {done.group(2)} s, no finding", flush=True)
    else:
        totals[1] += 1
        print(proc.stdout[-6000:])
        print(f"FAIL fuzz_{name}: libFuzzer exited with status {proc.returncode} (its finding is above)", flush=True)


# The sanitizers' options: every error fatal, with status 86 (a user error's is 1), the report
# into a file of a fresh folder that run_sanitized reads back (stderr is what the tests check).
# test/sanitize/lsan.supp says which leaks are not findings, and why. The sanitizers' training run
# (test/sanitize/train_run.py) imports the package attnlog and the CLI tests' tiny model.
def sanitizer_env(reports):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "scripts"), os.path.join(ROOT, "test")]))
    common = f"halt_on_error=1:exitcode=86:log_path={reports}/report"
    env["ASAN_OPTIONS"] = common + ":detect_leaks=1"
    env["UBSAN_OPTIONS"] = common + ":print_stacktrace=1"
    env["LSAN_OPTIONS"] = f"suppressions={ROOT}/test/sanitize/lsan.supp:print_suppressions=0"
    return env


# The one line a report may hold that is not a finding: a test forks a child after OpenMP has
# started threads, and at the child's exit LeakSanitizer notes that the parent's threads, which
# the child does not have, were not suspended. A leak it then finds is still reported.
FORK_NOTE = re.compile(r"^==\d+==Running thread \d+ was not suspended\. False leaks are possible\.$")


def run_sanitized(name, argv, totals):
    with tempfile.TemporaryDirectory() as reports:
        run_cpp(f"{name}, ASan + UBSan", argv, totals, env=sanitizer_env(reports))
        findings = []
        for report in sorted(os.listdir(reports)):
            with open(os.path.join(reports, report), errors="replace") as f:
                lines = [line for line in f.read().splitlines() if line.strip() and not FORK_NOTE.match(line)]
            findings += lines
    if findings:
        totals[1] += 1
        print("\n".join(findings[:200]))
        print(f"FAIL {name}: the sanitizers reported the findings above", flush=True)


def run_sanitize_tests(totals):
    run_sanitized("CPU parity with the PyTorch reference", ["build/sanitize/test_gpt_cpu", "build/ref"], totals)
    run_sanitized("CPU building blocks", ["build/sanitize/test_cpu_units"], totals)
    run_sanitized("data shards, loader, tokenizer, corpus preparation", ["build/sanitize/test_data"], totals)
    run_sanitized("run log writer", ["build/sanitize/test_runlog"], totals)
    run_sanitized("training, checkpoint and resume", [sys.executable, "test/sanitize/train_run.py", "build/sanitize/train"],
                  totals)


def gpu_present():
    try:
        return subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True).stdout.strip().startswith("GPU")
    except OSError:
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["sanitize"], help="run only the sanitizers' build")
    args = parser.parse_args()
    totals = [0, 0]
    if args.only == "sanitize":
        run_sanitize_tests(totals)
        print(f"{totals[0]} passed, {totals[1]} failed")
        return 1 if totals[1] else 0
    run_cpp("CPU parity with the PyTorch reference", ["build/test_gpt_cpu", "build/ref"], totals)
    run_cpp("CPU building blocks", ["build/test_cpu_units"], totals)
    run_cpp("data shards, loader, tokenizer, corpus preparation", ["build/test_data"], totals)
    run_cpp("run log writer", ["build/test_runlog"], totals)
    if gpu_present() and os.path.exists(os.path.join(ROOT, "build/test_gpt_cuda")):
        run_cpp("CUDA parity with the PyTorch reference", ["build/test_gpt_cuda", "build/ref"], totals)
    else:
        print("== CUDA parity: skipped (no GPU on this machine)")
    if os.path.exists(os.path.join(ROOT, "build/dev_cudnn_attention")):  # cuDNN's graphs need the library, not a GPU
        run_cpp("cuDNN attention graphs of ./train", ["build/dev_cudnn_attention", "--graph-only"], totals)
    tests = sorted(f"{folder}/{f}" for folder in ("test", "test/fuzz") for f in os.listdir(os.path.join(ROOT, folder))
                   if f.startswith("test_") and f.endswith(".py"))
    run_pytest(tests, totals)
    for name in FUZZ_HARNESSES:
        run_fuzz_smoke(name, totals)
    run_sanitize_tests(totals)
    print(f"{totals[0]} passed, {totals[1]} failed")
    return 1 if totals[1] else 0


if __name__ == "__main__":
    sys.exit(main())
