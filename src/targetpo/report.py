"""Markdown reports with PNG plots, built from stored runs only (a report never recomputes training).

`targetpo report DIR` writes DIR/REPORT.md: one section per run found in DIR (or DIR itself), each with the
experiment's tables (ours next to the paper's reference numbers), plots, and the paper's claims evaluated
from the data as PASS / FAIL. Only the presets in VERDICT_PRESETS get verdicts: a smoke run is far too short to
test a claim, so its claims read "n/a (smoke preset)" and are counted apart. Units that diverged (NaN/inf,
see runs/runner.py) are listed in their run's section with the step they stopped at.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path


from targetpo.experiments import EXPERIMENTS, load  # noqa: E402
from targetpo.runs import plots  # noqa: E402
from targetpo.runs.store import Run, find_runs  # noqa: E402


# The presets long enough to test the paper's claims; every other preset (smoke) gets no verdict.
VERDICT_PRESETS = ("cpu", "paper")


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
        plots.finish_figure(fig)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plots.pyplot().close(fig)
        rel = os.path.relpath(path, self.report_dir)
        self.blocks.append(f"![{caption}]({rel})\n\n*{caption}*\n")
        return path

    def claim(self, text: str, passed: bool | None, evidence: str) -> None:
        self.claims.append(Claim(text, None if passed is None else bool(passed), evidence))

    @property
    def gives_verdicts(self) -> bool:
        """Whether this run's preset can test the paper's claims (see VERDICT_PRESETS)."""
        return self.run.meta.get("preset") in VERDICT_PRESETS

    def verdicts(self) -> list[bool | None]:
        """Each claim's verdict as the report shows it: None where the preset or the data cannot decide."""
        return [c.passed if self.gives_verdicts else None for c in self.claims]

    def render(self) -> str:
        meta = self.run.meta
        head = [f"## {self.title}", "",
                f"Run `{self.run.path.name}` · preset **{meta.get('preset')}** · {len(meta.get('seeds', []))} seeds · "
                f"wall time {meta.get('wall_time_s', 0):.1f} s · status {meta.get('status')} · "
                f"data: {meta.get('data_source')} · torch {meta.get('versions', {}).get('torch')}", ""]
        diverged = self.run.diverged_units()
        if diverged:
            listed = ", ".join(f"`{u}` at step {step} ({metric})" for u, (step, metric) in diverged.items())
            head += [f"**Diverged ({len(diverged)} unit{'s' if len(diverged) != 1 else ''}):** {listed}: a NaN/inf "
                     "value stopped the unit there, so its curves end before that step and its numbers below "
                     "cover only the steps before it.", ""]
        if self.claims:
            na = "n/a" if self.gives_verdicts else f"n/a ({meta.get('preset')} preset)"
            head += ["| paper claim | result | evidence (ours) |", "|---|---|---|"]
            for c, verdict in zip(self.claims, self.verdicts()):
                shown = na if verdict is None else ("**PASS**" if verdict else "**FAIL**")
                head.append(f"| {c.text} | {shown} | {c.evidence} |")
            head.append("")
        return "\n".join(head) + "\n" + "\n".join(self.blocks)


def build_section(run: Run, report_dir: Path) -> Section:
    exp = load(run.experiment)
    section = Section(f"{exp.TITLE}", run, report_dir)
    if run.meta.get("status") == "not run":
        section.text(f"**NOT RUN.** {run.meta.get('reason', '')}")
        return section
    if not run.units() and run.diverged_units():
        section.text("**No metrics to report:** every unit diverged before its first record (listed above).")
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
    lines = ["# targetpo report", "",
             f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} from {len(runs)} run(s) in `{root}`. "
             f"Paper claims checked from our data: {claim_count(sections)}. "
             "Paper numbers are the reference constants of `targetpo.paper` (the paper's tables, or runs of the "
             "authors' code where the paper gives none); every other number is measured from this run's metrics.", ""]
    lines += ["## Contents", ""] + [f"- [{s.title}](#{_anchor(s.title)})" for s in sections] + [""]
    report_path.write_text("\n".join(lines) + "\n" + "\n".join(s.render() for s in sections))
    return report_path


def claim_count(sections: list[Section]) -> str:
    """The headline's tally, e.g. "**44 PASS, 13 FAIL** over the cpu and paper presets; 12 claims n/a on smoke
    runs": verdicts only from the presets that can test a claim, the rest counted apart."""
    judged = [s for s in sections if s.gives_verdicts]
    verdicts = [v for s in judged for v in s.verdicts()]
    presets = [p for p in VERDICT_PRESETS if any(s.run.meta.get("preset") == p for s in judged)]
    parts = []
    if presets:
        parts.append(f"**{verdicts.count(True)} PASS, {verdicts.count(False)} FAIL** over the "
                     f"{' and '.join(presets)} preset{'s' if len(presets) > 1 else ''}")
        if None in verdicts:
            parts.append(f"{verdicts.count(None)} n/a (not decidable from the data)")
    else:
        parts.append(f"no verdicts (only the {' and '.join(VERDICT_PRESETS)} presets can test a claim)")
    unjudged: dict[str, int] = {}
    for s in sections:
        if not s.gives_verdicts and s.claims:
            preset = str(s.run.meta.get("preset"))
            unjudged[preset] = unjudged.get(preset, 0) + len(s.claims)
    parts += [f"{n} claim{'s' if n != 1 else ''} n/a on {p} runs" for p, n in unjudged.items()]
    diverged = sum(len(s.run.diverged_units()) for s in sections)
    if diverged:
        parts.append(f"{diverged} unit{'s' if diverged != 1 else ''} diverged (listed in their sections)")
    return "; ".join(parts)


def _anchor(title: str) -> str:
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return keep.replace(" ", "-")
