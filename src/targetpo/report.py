"""Markdown reports with PNG plots, built from stored runs only (a report never recomputes training).

`targetpo report DIR` writes DIR/REPORT.md: one section per run found in DIR (or DIR itself), each with the
experiment's tables (ours next to the paper's reference numbers), plots, and the paper's claims evaluated
from the data (docs/verdicts.md). A claim's verdict comes from a 95 % seed interval against the claim's threshold
(runs/stats.py): PASS when the whole interval is on the claim's side, FAIL when it is wholly on the other side,
INCONCLUSIVE when it straddles the threshold (or there is one seed). Every FAIL is classified: *scale or data*
(an oracle floor, or the same claim passing at a larger preset in the same report, shows the gap comes from the
preset or its data), *seed noise* (the interval covers the paper's value), or *does not reproduce* (with what
was checked). Only the presets in VERDICT_PRESETS get verdicts: a smoke run is far too short to test a claim,
so its claims read "n/a (smoke preset)" and are counted apart. Units that diverged (NaN/inf, see
runs/runner.py) are listed in their run's section with the step they stopped at.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from targetpo.experiments import EXPERIMENTS, load  # noqa: E402
from targetpo.runs import plots  # noqa: E402
from targetpo.runs.stats import FAIL_CLASSES, NOT_REPRODUCED, SCALE, Failure, Verdict  # noqa: E402
from targetpo.runs.store import Run, find_runs  # noqa: E402


# The presets long enough to test the paper's claims; every other preset (smoke) gets no verdict.
VERDICT_PRESETS = ("cpu", "paper")


def _as_verdict(passed) -> Verdict | None:
    if passed is None:
        return None
    if isinstance(passed, (bool, np.bool_)):
        return Verdict.PASS if passed else Verdict.FAIL
    try:
        return Verdict(passed)
    except ValueError:
        raise ValueError(f"a claim's verdict must be a bool, None or one of {[v.value for v in Verdict]}, "
                         f"got {passed!r}") from None


@dataclass
class Claim:
    text: str
    verdict: Verdict | None  # None = could not be evaluated at this configuration
    evidence: str
    interval: bool = True  # False: decided on point estimates (a plain bool was given), shown as such
    candidates: tuple[Failure, ...] = ()  # explanations the experiment offers should the claim FAIL
    key: str = ""  # matches the same claim across presets; defaults to the text
    failure: Failure | None = None  # set by resolve_failures for a FAIL

    @property
    def passed(self) -> bool | None:
        return None if self.verdict in (None, Verdict.INCONCLUSIVE) else self.verdict is Verdict.PASS


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

    def claim(self, text: str, passed, evidence: str, *, failure: Failure | list | tuple | None = None,
              key: str | None = None) -> None:
        """Record a paper claim. `passed`: a Verdict (from seed intervals, runs/stats.py `below`/`above`/`within`/
        `all_of`), a bool (decided on point estimates: shown as such), or None (not decidable here). `failure`:
        the explanations to use should the claim FAIL, in order (None entries are skipped: a computed check that
        did not apply); a *scale or data* or *seed noise* entry wins over a *does not reproduce* one."""
        interval = not isinstance(passed, (bool, np.bool_))
        items = [failure] if failure is None or isinstance(failure, Failure) else list(failure)
        for f in items:
            if f is not None and not isinstance(f, Failure):
                raise ValueError(f"failure entries must be Failure or None, got {f!r}")
        self.claims.append(Claim(text, _as_verdict(passed), evidence, interval,
                                 tuple(f for f in items if f is not None), key or text))

    @property
    def gives_verdicts(self) -> bool:
        """Whether this run's preset can test the paper's claims (see VERDICT_PRESETS)."""
        return self.run.meta.get("preset") in VERDICT_PRESETS

    def verdicts(self) -> list[Verdict | None]:
        """Each claim's verdict as the report shows it: None where the preset or the data cannot decide."""
        return [c.verdict if self.gives_verdicts else None for c in self.claims]

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
            head += ["| paper claim | result | evidence (ours; [lo, hi] = 95 % seed interval) |", "|---|---|---|"]
            for c, verdict in zip(self.claims, self.verdicts()):
                head.append(f"| {c.text} | {_result_cell(c, verdict, na)} | {_evidence_cell(c, verdict)} |")
            head.append("")
        return "\n".join(head) + "\n" + "\n".join(self.blocks)


def _result_cell(c: Claim, verdict: Verdict | None, na: str) -> str:
    if verdict is None:
        return na
    shown = {Verdict.PASS: "**PASS**", Verdict.FAIL: "**FAIL**", Verdict.INCONCLUSIVE: "inconclusive"}[verdict]
    notes = ([c.failure.kind] if verdict is Verdict.FAIL and c.failure is not None else []) + \
        ([] if c.interval else ["point estimate"])
    return shown + (f" ({'; '.join(notes)})" if notes else "")


def _evidence_cell(c: Claim, verdict: Verdict | None) -> str:
    if verdict is Verdict.FAIL and c.failure is not None:
        return f"{c.evidence}. **{c.failure.kind.capitalize()}:** {c.failure.evidence}"
    return c.evidence


def run_scale(run: Run) -> tuple[int, int, int]:
    """How much a run tests: (preset rank in VERDICT_PRESETS, steps or episodes, seeds)."""
    cfg = run.meta.get("config", {})
    rank = VERDICT_PRESETS.index(run.meta["preset"]) if run.meta.get("preset") in VERDICT_PRESETS else -1
    length = cfg.get("steps") or cfg.get("episodes") or cfg.get("variant_episodes") or 0
    return rank, int(length), len(run.meta.get("seeds", []))


def is_larger(a: Run, b: Run) -> bool:
    """Whether run a tests more than run b: it covers every setting b lists (methods, delays, lengths, …: each
    list-valued config field of a holds b's), and it has a larger preset, or the same preset with at least as
    many steps and seeds and more of one of them."""
    ca, cb = a.meta.get("config", {}), b.meta.get("config", {})
    covers = all(set(map(str, ca.get(k) or ())) >= set(map(str, v))
                 for k, v in cb.items() if isinstance(v, (list, tuple)))
    (ra, la, sa), (rb, lb, sb) = run_scale(a), run_scale(b)
    return covers and (ra > rb or (ra == rb and la >= lb and sa >= sb and (la, sa) != (lb, sb)))


def _describe(run: Run) -> str:
    _, length, seeds = run_scale(run)
    return f"run `{run.path.name}` (preset {run.meta.get('preset')}, {length:,} steps, {seeds} seeds)"


def resolve_failures(sections: list["Section"]) -> None:
    """Give every FAIL its class (docs/verdicts.md §3): the experiment's *scale or data* / *seed noise* evidence
    first, then the same claim (same key) passing in a larger run of the same experiment in this report (*scale or
    data*), then the experiment's *does not reproduce* note; with none of these, *does not reproduce* with nothing
    found. A larger run where the claim FAILs too is added to the *does not reproduce* evidence."""
    by_claim: dict[tuple, list[tuple[Run, Verdict]]] = {}
    for s in sections:
        for c, v in zip(s.claims, s.verdicts()):
            if v is not None:
                by_claim.setdefault((s.run.meta.get("experiment"), c.key), []).append((s.run, v))
    for s in sections:
        for c, v in zip(s.claims, s.verdicts()):
            if v is not Verdict.FAIL:
                continue
            larger = [(r, w) for r, w in by_claim.get((s.run.meta.get("experiment"), c.key), [])
                      if is_larger(r, s.run)]
            passing = [r for r, w in larger if w is Verdict.PASS]
            also = [r for r, w in larger if w is Verdict.FAIL]
            explained = [f for f in c.candidates if f.kind != NOT_REPRODUCED]
            if explained:
                c.failure = explained[0]
            elif passing:
                c.failure = Failure(SCALE, f"the same claim is PASS in the larger {_describe(passing[0])}; this run "
                                           f"has {run_scale(s.run)[1]:,} steps and {run_scale(s.run)[2]} seeds")
            else:
                base = c.candidates[0] if c.candidates else Failure(
                    NOT_REPRODUCED, "no oracle floor, larger run or seed interval in this report explains it")
                extra = "".join(f"; the same claim also FAILs in the larger {_describe(r)}" for r in also)
                c.failure = base._replace(evidence=base.evidence + extra)


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
    resolve_failures(sections)
    lines = ["# targetpo report", "",
             f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} from {len(runs)} run(s) in `{root}`. "
             f"Paper claims checked from our data: {claim_count(sections)}. "
             "Paper numbers are the reference constants of `targetpo.paper` (the paper's tables, or runs of the "
             "authors' code where the paper gives none); every other number is measured from this run's metrics, and "
             "`mean [lo, hi]` is a seed mean with its 95 % interval over seeds (docs/verdicts.md).", ""]
    lines += ["## Contents", ""] + [f"- [{s.title}](#{_anchor(s.title)})" for s in sections] + [""]
    report_path.write_text("\n".join(lines) + "\n" + "\n".join(s.render() for s in sections))
    return report_path


def claim_count(sections: list[Section]) -> str:
    """The headline's tally, e.g. "**40 PASS, 11 FAIL (5 scale or data, 2 seed noise, 4 does not reproduce),
    5 inconclusive** over the cpu and paper presets; 12 claims n/a on smoke runs": verdicts only from the presets
    that can test a claim, the rest counted apart. Call resolve_failures first to class the FAILs."""
    judged = [s for s in sections if s.gives_verdicts]
    verdicts = [v for s in judged for v in s.verdicts()]
    fails = [c for s in judged for c, v in zip(s.claims, s.verdicts()) if v is Verdict.FAIL]
    points = sum(1 for s in judged for c, v in zip(s.claims, s.verdicts()) if v is not None and not c.interval)
    presets = [p for p in VERDICT_PRESETS if any(s.run.meta.get("preset") == p for s in judged)]
    parts = []
    if presets:
        by_class = [f"{n} {k}" for k in FAIL_CLASSES + ("unclassified",)
                    if (n := sum(1 for c in fails if (c.failure.kind if c.failure else "unclassified") == k))]
        fail = f"{len(fails)} FAIL" + (f" ({', '.join(by_class)})" if fails else "")
        parts.append(f"**{verdicts.count(Verdict.PASS)} PASS, {fail}, {verdicts.count(Verdict.INCONCLUSIVE)} "
                     f"inconclusive** over the {' and '.join(presets)} preset{'s' if len(presets) > 1 else ''}")
        if points:
            parts.append(f"{points} of these decided on point estimates (no seed interval)")
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
