"""Markdown reports with PNG plots, built from stored runs only (a report never recomputes training).

`targetpo report DIR` writes DIR/REPORT.md: one section per run found in DIR (or DIR itself), each with the
experiment's tables (ours next to the paper's reference numbers), plots, and the paper's claims evaluated
from the data as PASS / FAIL.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path


from targetpo.experiments import EXPERIMENTS, load  # noqa: E402
from targetpo.runs import plots  # noqa: E402
from targetpo.runs.store import Run, find_runs  # noqa: E402


@dataclass
class Claim:
    text: str
    passed: bool | None  # None = could not be evaluated at this configuration
    evidence: str


@dataclass
class Section:
    """Collects one run's report section. Plots are saved next to the run's metrics."""

    title: str
    run: Run
    report_dir: Path
    blocks: list[str] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)

    def text(self, markdown: str) -> None:
        self.blocks.append(markdown.strip() + "\n")

    def table(self, headers: list[str], rows: list[list], caption: str | None = None) -> None:
        lines = []
        if caption:
            lines.append(f"**{caption}**\n")
        lines.append("| " + " | ".join(headers) + " |")
        lines.append("|" + "---|" * len(headers))
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
        self.blocks.append("\n".join(lines) + "\n")

    def figure(self, fig, name: str, caption: str) -> Path:
        path = self.run.path / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plots.pyplot().close(fig)
        rel = os.path.relpath(path, self.report_dir)
        self.blocks.append(f"![{caption}]({rel})\n\n*{caption}*\n")
        return path

    def claim(self, text: str, passed: bool | None, evidence: str) -> None:
        self.claims.append(Claim(text, None if passed is None else bool(passed), evidence))

    def render(self) -> str:
        meta = self.run.meta
        head = [f"## {self.title}", "",
                f"Run `{self.run.path.name}` · preset **{meta.get('preset')}** · {len(meta.get('seeds', []))} seeds · "
                f"wall time {meta.get('wall_time_s', 0):.1f} s · status {meta.get('status')} · "
                f"data: {meta.get('data_source')} · torch {meta.get('versions', {}).get('torch')}", ""]
        if self.claims:
            head += ["| paper claim | result | evidence (ours) |", "|---|---|---|"]
            for c in self.claims:
                verdict = "n/a" if c.passed is None else ("**PASS**" if c.passed else "**FAIL**")
                head.append(f"| {c.text} | {verdict} | {c.evidence} |")
            head.append("")
        return "\n".join(head) + "\n" + "\n".join(self.blocks)


def build_section(run: Run, report_dir: Path) -> Section:
    exp = load(run.experiment)
    section = Section(f"{exp.TITLE}", run, report_dir)
    if run.meta.get("status") == "not run":
        section.text(f"**NOT RUN.** {run.meta.get('reason', '')}")
        return section
    exp.report(run, section)
    return section


def write_report(root: str | Path, out: str | Path | None = None) -> Path:
    """Write REPORT.md for every run under `root`; returns its path."""
    root = Path(root)
    runs = find_runs(root)
    if not runs:
        raise FileNotFoundError(f"no runs (directories with run.json) found in {root}")
    report_path = Path(out) if out else root / "REPORT.md"
    loaded = [Run.load(p) for p in runs]
    order = {name: i for i, name in enumerate(EXPERIMENTS)}  # the paper's order, as `targetpo list` shows it
    loaded.sort(key=lambda r: (order.get(r.experiment, len(order)), str(r.path)))
    sections = [build_section(r, report_path.parent) for r in loaded]
    n_pass = sum(c.passed is True for s in sections for c in s.claims)
    n_fail = sum(c.passed is False for s in sections for c in s.claims)
    lines = ["# targetpo report", "",
             f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} from {len(runs)} run(s) in `{root}`. "
             f"Paper claims checked from our data: **{n_pass} PASS, {n_fail} FAIL**. "
             "Paper numbers are the reference constants of `targetpo.paper` (the paper's tables, or runs of the "
             "authors' code where the paper gives none); every other number is measured from this run's metrics.", ""]
    lines += ["## Contents", ""] + [f"- [{s.title}](#{_anchor(s.title)})" for s in sections] + [""]
    report_path.write_text("\n".join(lines) + "\n" + "\n".join(s.render() for s in sections))
    return report_path


def _anchor(title: str) -> str:
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return keep.replace(" ", "-")
