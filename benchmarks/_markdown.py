"""Writing a benchmark's results into BENCHMARKS.md."""

from __future__ import annotations

from pathlib import Path


# Ends a script's generated part of a section: the prose written by hand after it is kept on --write.
END = "<!-- end of generated results -->"


def replace_section(path: str | Path, heading: str, section: str) -> None:
    """Replace the `## ...` section starting with `heading` in the markdown file `path` by `section` (appended
    when absent), up to the section's END marker where it has one (text after the marker stays); every other
    section is kept as it is, and one blank line stays before the next heading."""
    path = Path(path)
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    section = section.rstrip("\n") + "\n"
    start = text.find(heading)
    if start >= 0:
        end = text.find("\n## ", start + 1)
        marker = text.find(END, start, end if end >= 0 else len(text))
        if marker >= 0:
            text = text[:start] + section + "\n" + text[marker:]
        else:
            text = text[:start] + section + ("\n" + text[end + 1:] if end >= 0 else "")
    else:
        text = text.rstrip() + "\n\n" + section
    path.write_text(text)
