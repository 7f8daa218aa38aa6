"""Writing a benchmark's results into BENCHMARKS.md."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: str | Path, heading: str, section: str) -> None:
    """Replace the `## ...` section starting with `heading` in the markdown file `path` by `section` (appended
    when absent); every other section is kept as it is."""
    path = Path(path)
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start = text.find(heading)
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
    else:
        text = text.rstrip() + "\n\n" + section
    path.write_text(text)
