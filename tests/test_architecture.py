"""The package's shape (docs/architecture.md): imports go down only, slices never import one another, and no one
folder holds most of the code."""

import os
import re
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "targetpo"
MAX_SHARE = 0.30


def test_import_contracts_in_pyproject_are_kept():
    # import-linter reads the sources of wherever `targetpo` is found on the path: this checkout's src, first.
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    lint = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    proc = subprocess.run([sys.executable, "-c", lint, "--no-cache", "--config", str(ROOT / "pyproject.toml")],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    kept = re.search(r"Contracts: (\d+) kept, 0 broken", proc.stdout)
    assert kept and int(kept.group(1)) >= 2, proc.stdout[-2000:]  # the layers and the independence contract


def python_lines(path: Path) -> int:
    files = path.rglob("*.py") if path.is_dir() else [path]
    return sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files)


def test_lines_of_code_per_folder_is_well_spread():
    total = python_lines(PACKAGE)
    folders = [d for d in sorted(PACKAGE.iterdir()) if d.is_dir() and d.name != "__pycache__"]
    shares = {d.name: python_lines(d) / total for d in folders}
    listing = ", ".join(f"{name} {share:.1%}" for name, share in sorted(shares.items(), key=lambda kv: -kv[1]))
    over = {name: share for name, share in shares.items() if share > MAX_SHARE}
    assert not over, f"folders over {MAX_SHARE:.0%} of the package's {total} Python lines: {listing}"
