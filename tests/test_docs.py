"""The docs under docs/ are the only documents code may cite, and every citation must resolve.

Comments cite `docs/<page>.md §X` (a section heading `## §X …` or `## X …` of that page, e.g. method.md §2,
experiments.md §E4, differences.md §8); nothing in the code may point at a document outside the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from targetpo.experiments import EXPERIMENTS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CODE_DIRS = ("src", "tests", "benchmarks", "examples")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".sh"}
THIS = Path(__file__).resolve()

# A path citation followed by one or more section labels: "docs/method.md §2", "docs/experiments.md §E3, §E3b",
# "docs/differences.md §5–§6".
CITATION = re.compile(r"docs/([\w-]+)\.md((?:\s*[,–-]?\s*§[\w.]+)+)")
LABEL = re.compile(r"§([\w.]*\w)")
FORBIDDEN = (re.compile("spec " + "§"), re.compile(r"\.\./shared" + "/spec"), re.compile("PAPER" + "_SPEC"),
             re.compile(r"\bLLM" + r"_NOTES\b"), re.compile(r"\bDESIGN" + r"\.md\b"))


def code_files() -> list[Path]:
    files = []
    for d in CODE_DIRS:
        files += [p for p in (ROOT / d).rglob("*") if p.is_file() and p.suffix in SUFFIXES
                  and "__pycache__" not in p.parts and p.resolve() != THIS]
    return sorted(files)


def headings(page: str) -> set[str]:
    """Labels of a docs page's `## ` headings: '## §4 The tiny transformer' -> '4', '## E3b MNIST …' -> 'E3b'."""
    labels = set()
    for line in (DOCS / f"{page}.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            first = line[3:].split()[0] if line[3:].split() else ""
            labels.add(first.lstrip("§").rstrip(":.—"))
    return labels


def test_code_cites_no_document_outside_the_repository():
    files = code_files()
    assert any(p.name == "engine.py" for p in files)  # the scan reaches the package
    bad = []
    for p in files:
        for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if any(f.search(line) for f in FORBIDDEN):
                bad.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "citations of a document outside the repository (cite docs/ instead):\n" + "\n".join(bad)


def test_every_docs_citation_in_src_names_an_existing_heading():
    found, bad = 0, []
    for p in sorted((ROOT / "src").rglob("*.py")):
        text = p.read_text(encoding="utf-8")
        for m in CITATION.finditer(text):
            page = m.group(1)
            if not (DOCS / f"{page}.md").exists():
                bad.append(f"{p.relative_to(ROOT)}: docs/{page}.md does not exist")
                continue
            labels = headings(page)
            for label in LABEL.findall(m.group(2)):
                found += 1
                if label not in labels:
                    bad.append(f"{p.relative_to(ROOT)}: docs/{page}.md has no heading §{label}")
    assert found > 20, f"expected the code to cite docs/ sections, found {found} citations"
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page,expected", [
    ("method", {str(i) for i in range(1, 9)}),
    ("experiments", {f"E{i}" for i in range(1, 20)} | {"E3b"}),
    ("differences", {str(i) for i in range(1, 21)}),
])
def test_docs_pages_have_their_numbered_sections(page, expected):
    assert expected <= headings(page), sorted(expected - headings(page))


def test_every_experiment_is_documented():
    text = (DOCS / "experiments.md").read_text(encoding="utf-8")
    missing = [name for name in EXPERIMENTS if f"targetpo run {name}`" not in text]
    assert not missing, f"experiments not described in docs/experiments.md: {missing}"


def _last_numbered(page: str, prefix: str = "") -> int:
    return max(int(label[len(prefix):]) for label in headings(page)
               if label.startswith(prefix) and label[len(prefix):].isdigit())


def test_the_docs_index_and_the_experiments_intro_name_every_numbered_section():
    """docs/README.md and the opening of docs/experiments.md give section ranges; they end at the last heading."""
    index = " ".join((DOCS / "README.md").read_text(encoding="utf-8").split())
    assert f"§{_last_numbered('method')} " in index.split("[experiments.md]")[0]
    assert f"(§1 … §{_last_numbered('differences')})" in index
    last = f"E14 … E{_last_numbered('experiments', 'E')}"
    intro = " ".join((DOCS / "experiments.md").read_text(encoding="utf-8").split("\n## ")[0].split())
    assert last in index and last in intro, (last, index, intro)


# A repository path in prose or code: tests/…, src/…, examples/…, tools/…, benchmarks/…, docs/….
REPO_PATH = re.compile(r"\b(?:tests|src|examples|tools|benchmarks|docs)/[\w./-]*\w")


def test_every_repository_path_the_docs_name_exists():
    """README.md and docs/*.md name files as `tests/…`, `examples/…`, `targetpo/…`: each must exist."""
    bad = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for path in set(REPO_PATH.findall(text)):
            if not (ROOT / path).exists():
                bad.append(f"{page.relative_to(ROOT)}: {path}")
        for path in set(re.findall(r"`targetpo/([\w./-]*\w)`", text)):
            if not (ROOT / "src" / "targetpo" / path).exists():
                bad.append(f"{page.relative_to(ROOT)}: targetpo/{path}")
    assert not bad, "paths named in the docs that do not exist:\n" + "\n".join(sorted(bad))


def test_verdicts_page_quotes_the_reports_own_words():
    """docs/verdicts.md quotes the report's note for an unexplained FAIL: the quote is the report's text."""
    page = " ".join((DOCS / "verdicts.md").read_text(encoding="utf-8").split())
    quote = re.search(r'reproduce\* with "([^"]+)"', page).group(1)
    assert quote in (ROOT / "src" / "targetpo" / "report.py").read_text(encoding="utf-8"), quote


def _layout_block(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("```", 2)[1]


def test_architecture_layout_names_every_module():
    """docs/architecture.md's package layout names every module of every subpackage."""
    block = _layout_block((DOCS / "architecture.md").read_text(encoding="utf-8"), "## Package layout")
    pkg = ROOT / "src" / "targetpo"
    missing = [str(p.relative_to(pkg)) for p in sorted(pkg.glob("*/*.py"))
               if p.name != "__init__.py" and not re.search(rf"\b{re.escape(p.name)}\b", block)]
    assert not missing, f"modules missing from docs/architecture.md's layout: {missing}"


def test_readme_layout_names_every_experiment_and_example_folder():
    block = _layout_block((ROOT / "README.md").read_text(encoding="utf-8"), "## Layout")
    flat = " ".join(block.split())
    missing = [n for n in EXPERIMENTS if n not in flat and not (n.startswith("token-") and "token-*" in flat)]
    missing += [f"examples/{p.name}/" for p in sorted((ROOT / "examples").iterdir())
                if p.is_dir() and f"examples/{p.name}/" not in flat]
    assert not missing, f"missing from README.md's Layout: {missing}"


def test_readme_and_the_docs_index_link_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    pages = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "README.md"]
    missing = [f"README.md: {p}" for p in pages if f"(docs/{p})" not in readme]
    missing += [f"docs/README.md: {p}" for p in pages if f"({p})" not in index]
    assert not missing, missing
