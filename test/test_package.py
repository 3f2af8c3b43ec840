"""The Python side as one package, attnlog (scripts/attnlog/, pyproject.toml): it installs offline
with Debian's pip and setuptools and gives its commands; its modules import each other without a
loop and nothing from test/; every command reports a user error the same way (attnlog.commands).

    /usr/bin/python3 -m pytest -q test/test_package.py
"""
import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attnlog import commands

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "scripts" / "attnlog"
COMMANDS = {"attnlog": "attnlog.py", "attnlog-report": "report.py", "attnlog-probe": "probe.py",
            "attnlog-export-hf": "export_hf.py", "attnlog-tokenize-hf": "tokenize_hf.py",
            "attnlog-experiment": "experiment.py"}  # installed name: its script
# Arguments each command takes (the inputs need not exist) and an option none of them knows.
BAD_OPTION = {"attnlog.py": ["info", "x.attnlog"], "report.py": ["x.attnlog"], "probe.py": ["svd", "x.ckpt"],
              "export_hf.py": ["x.ckpt", "out"], "tokenize_hf.py": ["encode", "tokenizer.json", "text"], "bench.py": ["cpu"],
              "experiment.py": ["runs"]}


# -- pip install -e . ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A virtual environment that sees Debian's packages (numpy, matplotlib, ...), with the package
    installed into it editable, offline, from a copy of the project (the checkout stays as it is)."""
    tmp = tmp_path_factory.mktemp("package")
    project = tmp / "project"
    shutil.copytree(ROOT / "scripts", project / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    env = clean_env(PIP_NO_INDEX="1", PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(tmp / "venv")],
                          capture_output=True, text=True, env=env)
    assert made.returncode == 0, made.stderr
    python = tmp / "venv" / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-e",
                                str(project)], capture_output=True, text=True, env=env, cwd=tmp)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    return tmp / "venv" / "bin", project


def clean_env(**more):
    """The environment without a PYTHONPATH that could find the package some other way."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(more)
    return env


def test_installed_package_imports(venv, tmp_path):
    bin_dir, project = venv
    code = "import attnlog, attnlog.report, attnlog.summary; print(attnlog.__file__); print(attnlog.open_log.__name__)"
    result = subprocess.run([str(bin_dir / "python"), "-c", code], capture_output=True, text=True, cwd=tmp_path,
                            env=clean_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(project / "scripts" / "attnlog" / "__init__.py"), "open_log"]


def test_wheel_holds_the_package_data(venv, tmp_path):
    """A wheel, what a plain (not editable) install builds, holds the package's data files beside
    its modules: the research notes' claims the report reads."""
    bin_dir, project = venv
    env = clean_env(PIP_NO_INDEX="1", PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    built = subprocess.run([str(bin_dir / "python"), "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w",
                            str(tmp_path), str(project)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = tmp_path.glob("attnlog-*.whl")
    assert "attnlog/claims.json" in zipfile.ZipFile(wheel).namelist()


@pytest.mark.parametrize("command", COMMANDS)
def test_installed_commands(venv, tmp_path, command):
    bin_dir, _ = venv
    result = subprocess.run([str(bin_dir / command), "-h"], capture_output=True, text=True, cwd=tmp_path,
                            env=clean_env())
    assert result.returncode == 0 and result.stdout.startswith(f"usage: {command} "), result.stderr
    failed = subprocess.run([str(bin_dir / command), *BAD_OPTION[COMMANDS[command]], "--no-such-option"],
                            capture_output=True, text=True, cwd=tmp_path, env=clean_env())
    assert_one_line_error(failed, "--no-such-option", f"(see {command} -h)")


# -- one error convention --------------------------------------------------------------------------------


def assert_one_line_error(result, *parts):
    assert result.returncode == commands.USER_ERROR, (result.stdout, result.stderr)
    assert result.stdout == "" and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, \
        result.stderr
    assert all(part in result.stderr for part in parts), result.stderr


def checkout(script, *args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / script), *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env=clean_env())


@pytest.mark.parametrize("script", BAD_OPTION)
def test_every_command_reports_a_bad_option_in_one_line(script):
    assert_one_line_error(checkout(script, *BAD_OPTION[script], "--no-such-option"),
                          "unrecognized arguments: --no-such-option", f"(see {script} -h)")


@pytest.mark.parametrize("script, args", [
    ("attnlog.py", ["info", "{missing}"]),
    ("report.py", ["{missing}", "-o", "{out}"]),
    ("probe.py", ["svd", "{missing}", "--out", "{out}"]),
    ("export_hf.py", ["{missing}", "{out}"]),
    ("tokenize_hf.py", ["prepare", "{missing}", "{missing}", "--out", "{out}"]),
])
def test_every_command_reports_a_missing_input_in_one_line(script, args, tmp_path):
    missing = tmp_path / "missing.file"
    result = checkout(script, *[a.format(missing=missing, out=tmp_path / "out") for a in args])
    assert_one_line_error(result, str(missing), "No such file or directory")


def test_bench_reports_its_errors_in_one_line(tmp_path):
    assert_one_line_error(checkout("bench.py", "cpu", "--data-dir", tmp_path / "nowhere"))


def test_run_returns_the_status_of_the_command(capsys):
    assert commands.run(lambda args: None, lambda argv: argv, []) == 0
    assert commands.run(lambda args: 3, lambda argv: argv, []) == 3
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("error, line", [
    (commands.UserError("x.log: damaged\nsecond line"), "error: x.log: damaged\\nsecond line\n"),
    (FileNotFoundError(2, "No such file or directory", "out/report.md"),
     "error: out/report.md: cannot write (No such file or directory)\n"),
    (OSError(28, "No space left on device"), "error: the output: cannot write (No space left on device)\n"),
])
def test_run_reports_a_user_error_in_one_line(capsys, error, line):
    def fail(args):
        raise error
    assert commands.run(fail, lambda argv: argv) == commands.USER_ERROR == 1  # as ./train's
    assert capsys.readouterr() == ("", line)


def test_run_reports_a_usage_error_in_one_line(capsys):
    parser = commands.ArgumentParser(prog="tool")
    parser.add_argument("--n", type=int)
    assert commands.run(lambda args: 0, parser.parse_args, ["--n", "x"]) == commands.USER_ERROR
    assert capsys.readouterr() == ("", "error: argument --n: invalid int value: 'x' (see tool -h)\n")
    with pytest.raises(SystemExit) as help_asked:
        commands.run(lambda args: 0, parser.parse_args, ["-h"])
    assert help_asked.value.code == 0


def test_run_stops_on_ctrl_c(capsys):
    def interrupted(args):
        raise KeyboardInterrupt
    assert commands.run(interrupted, lambda argv: argv) == commands.INTERRUPTED == 130
    assert capsys.readouterr() == ("", "interrupted\n")


# -- the modules' imports --------------------------------------------------------------------------------


def package_imports(path):
    """The modules of the package that the module at path imports, anywhere in it ("__init__" where
    it takes a name from the package itself, which its __init__.py defines)."""
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[:1] == ["attnlog"] and len(parts) > 1 and parts[1] in modules:
                found.add(parts[1])
            elif parts[:1] == ["attnlog"] and (len(parts) == 1) == isinstance(node, ast.Import):
                found.add("__init__")  # a name the package itself defines
    return found - {path.stem}


def test_no_import_loop():
    graph = {path.stem: package_imports(path) for path in PACKAGE.glob("*.py")}
    done, stack = set(), []

    def visit(module):
        assert module not in stack, " -> ".join(stack[stack.index(module):] + [module])
        if module not in done:
            stack.append(module)
            for imported in sorted(graph[module]):
                visit(imported)
            stack.pop()
            done.add(module)

    for module in sorted(graph):
        visit(module)
    assert graph["verdicts"] >= {"analysis"} and "verdicts" not in graph["analysis"] | graph["__init__"]


def test_production_code_imports_nothing_from_test_and_nobody_edits_sys_path():
    test_modules = {p.stem for p in (ROOT / "test").glob("*.py")}
    for path in sorted(list((ROOT / "scripts").rglob("*.py")) + list((ROOT / "test").rglob("*.py"))):
        tree = ast.parse(path.read_text())
        assert not [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "path"
                    and isinstance(node.value, ast.Name) and node.value.id == "sys"], path
        if path.is_relative_to(ROOT / "scripts"):
            imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                        for alias in node.names}
            imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                         if isinstance(node, ast.ImportFrom) and node.module}
            assert not imported & test_modules, (path, imported & test_modules)
