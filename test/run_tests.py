"""Runs every test of the project and prints the summary line "N passed, N failed".

C++ test programs print one line per check ("PASS name" / "FAIL name: why"); pytest suites are
counted from their JUnit report. Tests that need a GPU run only when one is present; otherwise one
line says they were skipped. Run through `make test`, which builds what this runs first.
"""
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cpp(name, argv, totals):
    print(f"== {name}: {' '.join(argv)}", flush=True)
    proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    passed = failed = 0
    for line in proc.stdout.splitlines():
        if line.startswith("PASS "):
            passed += 1
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


def gpu_present():
    try:
        return subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True).stdout.strip().startswith("GPU")
    except OSError:
        return False


def main():
    totals = [0, 0]
    run_cpp("CPU parity with the PyTorch reference", ["build/test_gpt_cpu", "build/ref"], totals)
    run_cpp("CPU building blocks", ["build/test_cpu_units"], totals)
    run_cpp("data shards, loader, tokenizer, corpus preparation", ["build/test_data"], totals)
    run_cpp("run log writer", ["build/test_runlog"], totals)
    if gpu_present() and os.path.exists(os.path.join(ROOT, "build/test_gpt_cuda")):
        run_cpp("CUDA parity with the PyTorch reference", ["build/test_gpt_cuda", "build/ref"], totals)
    else:
        print("== CUDA parity: skipped (no GPU on this machine)")
    tests = sorted(f"test/{f}" for f in os.listdir(os.path.join(ROOT, "test")) if f.startswith("test_") and f.endswith(".py"))
    run_pytest(tests, totals)
    print(f"{totals[0]} passed, {totals[1]} failed")
    return 1 if totals[1] else 0


if __name__ == "__main__":
    sys.exit(main())
