"""cuDNN and NCCL from PyTorch's wheels. The build: where neither the CUDA toolkit, the system nor a
conda environment has cuDNN's or NCCL's header, the Makefile takes it from a folder
nvidia/<package>/include on python3's sys.path. The run (llmc/dynamic_library.h): where the loader
cannot find libcudnn.so.9 by its name, the programs take it from a folder nvidia/cudnn/lib there,
and cuDNN then loads its own parts from beside it. Run on the machine's cuDNN, hidden from the
loader (its cache ignored: ld.so --inhibit-cache) and shown to the programs as a wheel's folder of
links to its files; dev_cudnn_attention --graph-only builds ./train's attention graphs with it, no
GPU needed.

    /usr/bin/python3 -m pytest -q test/test_wheel_libraries.py
"""
import ctypes
import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BINARY = ROOT / "build" / "dev_cudnn_attention"


def loaded_path(soname):
    """The file the loader opens for soname in this process, or None where it finds none."""
    try:
        ctypes.CDLL(soname)
    except OSError:
        return None
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith(soname):
                return path
    return None


def python3_without_site(tmp_path):
    """A folder holding a python3 that runs without its site-packages (-S), for the front of PATH: a
    machine whose python3 has PyTorch's own wheels would otherwise show them; PYTHONPATH still counts."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    return bin_dir


def make_env(**assignments):
    """The environment for a make of its own (none of the make that runs the tests' settings)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    env.update(assignments)
    return env


def test_headers_from_a_wheel(tmp_path):
    site, conda = tmp_path / "site", tmp_path / "conda"
    for folder, header in ((site / "nvidia" / "cudnn" / "include", "cudnn_graph.h"),
                           (site / "nvidia" / "nccl" / "include", "nccl.h"), (conda / "include", "cudnn_graph.h")):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / header).write_text("")
    bin_dir = python3_without_site(tmp_path)

    def flags(pythonpath):
        """The Makefile's flags for cuDNN and NCCL, its own finds of their headers left out."""
        env = make_env(PYTHONPATH=pythonpath, CONDA_PREFIX="",
                       PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        out = subprocess.run(["make", "-s", "--no-print-directory", "--eval",
                              'wheel-flags: ; @echo "$(CUDNN_CFLAGS)|$(NCCL_CFLAGS)"', "wheel-flags", "NVCC=nvcc",
                              "CUDNN_SYSTEM_INC=", "NCCL_SYSTEM_INC="], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=60)
        assert out.returncode == 0, out.stdout
        return out.stdout.strip()

    assert flags(str(site)) == (f"-DUSE_CUDNN -I{site}/nvidia/cudnn/include|-DUSE_NCCL -I{site}/nvidia/nccl/include")
    assert flags(str(tmp_path / "elsewhere")) == "|"
    # an active conda environment's header: the Makefile's own find, its other places left out
    env = make_env(CONDA_PREFIX=str(conda))
    out = subprocess.run(["make", "-s", "--no-print-directory", "--eval", 'wheel-flags: ; @echo "$(CUDNN_CFLAGS)"',
                          "wheel-flags", "NVCC=/nonexistent/bin/nvcc", "MULTIARCH=none"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    if not os.path.exists("/usr/include/cudnn_graph.h"):  # the system's header would come first
        assert out.stdout.strip() == f"-DUSE_CUDNN -I{conda}/include/", out.stdout


def test_cudnn_from_a_wheels_folder(tmp_path):
    if not BINARY.exists():
        pytest.skip("no build/dev_cudnn_attention (built where nvcc and cuDNN's headers are)")
    cudnn = loaded_path("libcudnn.so.9")
    if cudnn is None:
        pytest.skip("no cuDNN 9 on this machine")
    loaders = sorted(glob.glob("/lib64/ld-linux-*.so.2") + glob.glob("/lib/ld-linux-*.so.*"))
    if not loaders:
        pytest.skip("no dynamic loader found to run without its cache")
    site = tmp_path / "site"
    lib = site / "nvidia" / "cudnn" / "lib"
    lib.mkdir(parents=True)
    for part in glob.glob(os.path.join(os.path.dirname(cudnn), "libcudnn*.so.9")):
        (lib / os.path.basename(part)).symlink_to(os.path.realpath(part))

    bin_dir = python3_without_site(tmp_path)

    def run(pythonpath):
        env = dict(os.environ, PYTHONPATH=pythonpath, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        env.pop("LD_LIBRARY_PATH", None)
        return subprocess.run([loaders[0], "--inhibit-cache", str(BINARY), "--graph-only"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)

    hidden = run(str(tmp_path / "elsewhere"))
    if "this build has no cuDNN" in hidden.stdout:  # the library without its header: built without cuDNN
        pytest.skip(f"build/dev_cudnn_attention was built without cuDNN's header (its library: {cudnn})")
    assert "cannot load libcudnn.so.9" in hidden.stdout and "nor find it in PyTorch's wheels" in hidden.stdout, \
        hidden.stdout[-2000:]
    found = run(str(site))
    assert found.returncode == 0, found.stdout[-2000:]
    assert f"from {lib / 'libcudnn.so.9'}" in found.stdout, found.stdout[-2000:]
    assert found.stdout.rstrip().endswith("passed, 0 failed") and "\n0 passed" not in found.stdout, found.stdout[-2000:]
