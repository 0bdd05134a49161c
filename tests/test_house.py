"""The house's own checks, run with the tests: the layers and the absence of import cycles (import-linter's
contracts in pyproject.toml), lint and format (ruff, configured in pyproject.toml), and the size of classes and
files."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIRS = PYPROJECT["tool"]["setuptools"]["package-dir"]  # import package -> folder
MAX_CLASS, MAX_FILE = 200, 500


def sources() -> list[Path]:
    return sorted(p for folder in set(PACKAGE_DIRS.values()) for p in (ROOT / folder).rglob("*.py"))


def installed_layout(dest: Path) -> Path:
    """The package as installed (`package-dir` maps top-level folders into `speechrt`), made of symlinks: the
    tree import-linter reads, since it walks the root package's folder and would not find the mapped ones."""
    pkg = dest / "speechrt"
    pkg.mkdir(parents=True)
    for entry in (ROOT / PACKAGE_DIRS["speechrt"]).iterdir():
        (pkg / entry.name).symlink_to(entry)
    for name, folder in PACKAGE_DIRS.items():
        if name.count(".") == 1:
            (pkg / name.split(".")[1]).symlink_to(ROOT / folder)
    return dest


def run(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300, **kw)


def test_layers_and_no_cycles(tmp_path):
    """lint-imports checks the contracts of pyproject.toml [tool.importlinter] on the installed layout."""
    env = dict(os.environ, PYTHONPATH=str(installed_layout(tmp_path)))
    cmd = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    # run from tmp_path: from the repository root, its own speechrt/ folder would come first on sys.path
    args = [sys.executable, "-c", cmd, str(ROOT / "pyproject.toml"), "--no-cache"]
    r = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert " broken" in r.stdout and "0 broken" in r.stdout


def test_ruff_check_and_format():
    lint = run([sys.executable, "-m", "ruff", "check", "."])
    assert lint.returncode == 0, lint.stdout[-6000:] + lint.stderr
    fmt = run([sys.executable, "-m", "ruff", "format", "--check", "."])
    assert fmt.returncode == 0, fmt.stdout[-6000:] + fmt.stderr


def test_classes_and_files_stay_small():
    """No class over 200 lines, no file over 500: a module that grows past them is split along a
    responsibility (named in the new file's first line)."""
    big = []
    for p in sources():
        text = p.read_text()
        if (n := len(text.splitlines())) > MAX_FILE:
            big.append(f"{p.relative_to(ROOT)}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and (n := node.end_lineno - node.lineno + 1) > MAX_CLASS:
                big.append(f"{p.relative_to(ROOT)}:{node.lineno} class {node.name}: {n} lines")
    assert not big, "\n".join(big)


def test_every_module_says_what_it_is_for():
    missing = [
        str(p.relative_to(ROOT))
        for p in sources()
        if p.stat().st_size and not ast.get_docstring(ast.parse(p.read_text()))
    ]
    assert not missing, missing


def test_only_the_top_layer_imports_the_package_face():
    """`import speechrt` / `from speechrt import name` (the public API of speechrt/__init__.py, which loads
    the pipelines) from below the top layer would be an upward import that no layer contract sees, since the
    root package is no layer. Sub-packages and modules are imported by their full names instead."""
    top = ("speechrt/cli", "speechrt/bench/", "speechrt/__", "speechrt/scale.py")
    modules = {p.name for p in (ROOT / "speechrt").iterdir()} | {n.split(".")[1] for n in PACKAGE_DIRS if "." in n}
    bad = []
    for p in sources():
        rel = str(p.relative_to(ROOT))
        if rel.startswith(top):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import) and any(a.name == "speechrt" for a in node.names):
                bad.append(f"{rel}:{node.lineno} import speechrt")
            elif isinstance(node, ast.ImportFrom) and node.module == "speechrt" and node.level == 0:
                bad += [
                    f"{rel}:{node.lineno} from speechrt import {a.name}"
                    for a in node.names
                    if a.name not in modules and f"{a.name}.py" not in modules
                ]
    assert not bad, "\n".join(bad)
