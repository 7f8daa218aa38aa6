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

A run that has not finished every unit (stopped, or still running) says so at the top of its section: which units
are done, which partial (up to which step) and which not started, and whether a process still writes it. Table
rows of a partial unit are marked as such, and its claims read "n/a (run incomplete)": a partial unit's last value
is not its final one. In a report over a directory, a run whose files cannot be read (or whose report fails) gets
a section saying why and the others are reported; a report of that run alone stops with the same one-line reason.
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from targetpo.experiments import EXPERIMENTS, UnknownExperiment, load, suite_of  # noqa: E402
from targetpo.runs import plots  # noqa: E402
from targetpo.runs.config import config_class, config_fields, make_config, show  # noqa: E402
from targetpo.runs.runner import (DATA_LOCATION, NEEDS_DIVERGED, Progress, config_differences,  # noqa: E402
                                  file_in_the_way, run_is_live, run_progress, stored_config)
from targetpo.runs.stats import FAIL_CLASSES, NOT_REPRODUCED, SCALE, SETTINGS, Failure, Verdict, count  # noqa: E402
from targetpo.runs.store import METRICS_FILE, RUN_FILE, Run, RunFileError, find_runs, seed_count  # noqa: E402


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
    progress: Progress | None = None  # None: not checked (a section built by hand), taken as complete
    overrides: dict = field(default_factory=dict)  # {field: (this run's, its preset's)} (preset_overrides)
    error: str | None = None  # why this run could not be read or reported; the section then says only that

    def text(self, markdown: str) -> None:
        self.blocks.append(markdown.strip() + "\n")

    def table(self, headers: list[str], rows: list[list], caption: str | None = None) -> None:
        lines = []
        if caption:
            lines.append(f"**{caption}**\n")
        lines.append("| " + " | ".join(headers) + " |")
        lines.append("|" + "---|" * len(headers))
        marked = [self._marked(row) for row in rows]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in marked]
        if self.progress and self.progress.partial and marked == rows:
            # No row label names a partial unit (its values sit in a column, say): say so under the table.
            word = step_word(self.run)
            lines.append("\n*Incomplete run: values of " + ", ".join(
                f"`{u}` are from {word} {last} of {planned}" for u, (last, planned) in self.progress.partial.items())
                + ", not final.*")
        self.blocks.append("\n".join(lines) + "\n")

    def figure(self, fig, name: str, caption: str) -> Path:
        path = self.run.path / f"{name}.png"
        plots.finish_figure(fig)
        if not os.access(self.run.path, os.W_OK):
            # A read-only run folder (an archive, another user's results) is still reported: its plots go beside
            # the report instead, and the caption says so.
            path = self.report_dir / f"{self.run.path.name}-{name}.png"
            caption += f" (saved beside the report: the run folder {self.run.path} is read-only)"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plots.pyplot().close(fig)
        rel = os.path.relpath(path, self.report_dir)
        # <…> keeps a path with spaces one link target (CommonMark ends a bare target at the first space).
        self.blocks.append(f"![{caption}]({f'<{rel}>' if ' ' in rel else rel})\n\n*{caption}*\n")
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

    def _marked(self, row: list) -> list:
        """`row` with its first cell marked when it shows a partial unit's numbers (see partial_mark)."""
        mark = partial_mark(self.progress, str(row[0]), step_word(self.run)) if row and self.progress else None
        return [f"{row[0]} *({mark})*", *row[1:]] if mark else row

    @property
    def gives_verdicts(self) -> bool:
        """Whether this run's preset can test the paper's claims (see VERDICT_PRESETS)."""
        return self.run.meta.get("preset") in VERDICT_PRESETS

    @property
    def complete(self) -> bool:
        """Whether every unit of the run is finished; a partial unit's last values are not final ones."""
        return self.progress is None or self.progress.complete

    def verdicts(self) -> list[Verdict | None]:
        """Each claim's verdict as the report shows it: None where the preset or the data cannot decide."""
        return [c.verdict if self.gives_verdicts and self.complete else None for c in self.claims]

    @property
    def paper_claims(self) -> bool:
        """Whether its claims are the paper's: an experiment outside the paper suite (an open question) states
        its own."""
        name = self.run.meta.get("experiment")
        return name not in EXPERIMENTS or suite_of(name) == "paper"

    def render(self) -> str:
        if self.error is not None:
            return f"## {self.title}\n\n{self.error}\n"
        meta = self.run.meta
        status, live = meta.get("status"), None
        if status == "running":
            # run.json says "running" from a run's start to its end, so a killed run still says it: the folder's
            # lock tells whether a process is writing there now.
            live = run_is_live(self.run.path)
            status = "stopped before the end (killed or interrupted)" if live is False else status
        head = [f"## {self.title}", "",
                f"Run `{self.run.path.name}`"
                + (f" (`{meta.get('experiment')}`)" if meta.get("experiment") not in (None, self.run.path.name) else "")
                + f" · preset **{meta.get('preset')}** · {count(seed_count(meta), 'seed')} · "
                f"wall time {meta.get('wall_time_s', 0):.1f} s · status {status} · "
                f"data: {meta.get('data_source')} · torch {meta.get('versions', {}).get('torch')}"
                + (f" on {meta['versions']['cpu']}" if meta.get("versions", {}).get("cpu") else "")
                + (f" · device {meta.get('device')}, peak GPU memory {meta['peak_gpu_memory_bytes'] / 2**30:.2f} GiB"
                   if "peak_gpu_memory_bytes" in meta else ""), ""]
        mismatches = meta.get("resume_mismatches") or []
        if mismatches:
            units = sorted({str(m[0]) for m in mismatches})
            head += [f"**Resumed on other numbers:** {count(len(mismatches), 'replayed record')} of {_units(units)} "
                     "differed from the lines already on disk (another torch, CPU or device, or a hand edit), so "
                     "these curves mix two computations; the original lines were kept. Rerun with --force for "
                     "curves from one.", ""]
        if self.overrides:
            head += [f"**Overrides:** {show_overrides(self.overrides, self.run)}; the paper's claims are checked at "
                     "these settings (a FAIL is classed *settings differ from the preset* unless something else "
                     "explains it).", ""]
        if not self.complete:
            head += [incomplete_note(self.run, self.progress, live), ""]
        diverged = self.run.diverged_units()
        if diverged:
            listed = ", ".join(f"`{u}` at step {step} ({metric})" for u, (step, metric) in diverged.items())
            head += [f"**Diverged ({count(len(diverged), 'unit')}):** {listed}: a NaN/inf "
                     "value stopped the unit there, so its curves end before that step and its numbers below "
                     "cover only the steps before it"
                     + ("; a unit that needs a diverged one was not run" if any(
                         str(m).startswith(NEEDS_DIVERGED) for _, m in diverged.values()) else "") + ".", ""]
        if self.claims:
            na = ("n/a (run incomplete)" if not self.complete else
                  "n/a" if self.gives_verdicts else f"n/a ({meta.get('preset')} preset)")
            what = "paper claim" if self.paper_claims else "claim (an open question's, not the paper's)"
            head += [f"| {what} | result | evidence (ours; [lo, hi] = 95 % seed interval) |", "|---|---|---|"]
            for c, verdict in zip(self.claims, self.verdicts()):
                head.append(f"| {c.text} | {_result_cell(c, verdict, na)} | {_evidence_cell(c, verdict)} |")
            head.append("")
        return "\n".join(head) + "\n" + "\n".join(self.blocks)


def resume_command(run: Run) -> str:
    """The command that continues `run`: its folder quoted for a shell, and the device it ran on."""
    device = run.meta.get("device") or "cpu"
    return (f"targetpo run {run.meta.get('experiment')} --out {shlex.quote(str(run.path))} --resume"
            + ("" if device == "cpu" else f" --device {device}"))


def step_word(run: Run) -> str:
    """What a unit's steps are called in this run's config: episodes (token tasks) or steps."""
    return "episode" if any(k.endswith("episodes") for k in run.meta.get("config", {})) else "step"


def _units(names) -> str:
    return ", ".join(f"`{u}`" for u in names)


def incomplete_note(run: Run, progress: Progress, live: bool | None = None) -> str:
    """The banner atop an unfinished run's section: which units are done, partial (up to which step) and missing;
    `live` (:func:`runs.runner.run_is_live`) says whether a process is still writing it (None: unknown)."""
    word = step_word(run)
    total = len(progress.finished) + len(progress.partial) + len(progress.missing)
    parts = [f"{len(progress.finished)} of {total} units finished" + (f" ({_units(progress.finished)})"
                                                                     if progress.finished else "")]
    if progress.partial:
        parts.append("partial: " + ", ".join(f"`{u}` (last logged {word} {last} of {planned})"
                                             for u, (last, planned) in progress.partial.items()))
    if progress.missing:
        parts.append(f"not started: {_units(progress.missing)}")
    caveats = ([f"a partial unit's numbers below are from its last logged {word}, not its final one (marked "
                "*partial*)"] if progress.partial else []) + (["units not started are absent"] if progress.missing else [])
    caveat = ", ".join(caveats)
    lead = f"{caveat[0].upper()}{caveat[1:]}; the" if caveat else "The"
    status = str(run.meta.get("status", ""))
    why = (status if status.startswith("failed") else  # e.g. "failed (OutOfMemoryError: ...)": it did not stop by itself
           {True: "still running", False: "stopped before the end"}.get(live, "killed, or still running"))
    return (f"**Incomplete run** ({why}): {'; '.join(parts)}. {lead} claims are n/a until "
            "every unit is finished: resume it with "
            f"`{resume_command(run)}`.")


def _plain(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def partial_mark(progress: Progress, label: str, word: str = "step") -> str | None:
    """The mark for a table row labelled `label` that shows a partial unit: a unit whose name has a part equal to
    the label up to case and punctuation ("TPO" for `h3/tpo`, "GRPO (no KL)" for `grpo_no_kl`, "TPO (sum)" for
    `tpo_sum@seed0`), or any row when the run has a single unit (every row comes from it). None for other rows."""
    single = len(progress.finished) + len(progress.partial) + len(progress.missing) == 1
    hits = [(u, step) for u, step in progress.partial.items()
            if single or _plain(label) in {_plain(part) for part in re.split(r"[/@]", u)}]
    if not hits:
        return None
    return "partial: " + "; ".join(f"`{u}` at {word} {last} of {planned}" for u, (last, planned) in hits)


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


def length_fields(experiment: str | None) -> tuple[str, ...]:
    """The config fields that say how long a run of `experiment` trains: `steps` or `episodes`, or, where the
    experiment fixes that field and sets lengths per part (dg-epochs' `terminal_episodes`, `variant_episodes`),
    those parts' fields. An experiment this version does not know: `steps` or `episodes`, whichever it has."""
    if experiment not in EXPERIMENTS:
        return ("steps", "episodes")
    fields = config_fields(config_class(load(experiment)))
    for name in ("steps", "episodes"):
        if name in fields and not fields[name].metadata.get("fixed"):
            return (name,)
    return tuple(n for n, f in fields.items() if re.search(r"_(steps|episodes)$", n) and not f.metadata.get("fixed"))


def run_scale(run: Run) -> tuple[int, int, int]:
    """How much a run tests: (preset rank in VERDICT_PRESETS, steps or episodes in all, seeds)."""
    cfg = run.meta.get("config", {})
    rank = VERDICT_PRESETS.index(run.meta["preset"]) if run.meta.get("preset") in VERDICT_PRESETS else -1
    length = sum(int(cfg.get(n) or 0) for n in length_fields(run.meta.get("experiment")))
    return rank, length, seed_count(run.meta)


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
    fields = length_fields(run.meta.get("experiment"))
    word = "episode" if fields and fields[0].endswith("episodes") else "step"
    parts = " + ".join(f"{int(run.meta['config'].get(n) or 0):,}" for n in fields) if len(fields) > 1 else None
    size = f"{parts} {word}s" if parts else count(length, word)
    return f"run `{run.path.name}` (preset {run.meta.get('preset')}, {size}, {count(seeds, 'seed')})"


def resolve_failures(sections: list["Section"]) -> None:
    """Give every FAIL its class (docs/verdicts.md §3): the experiment's *scale or data* / *seed noise* evidence
    first (its *scale or data* only while no larger run FAILs the claim too), then the same claim (same key) passing in a larger run of the same experiment in this report (*scale or
    data*), then the experiment's *does not reproduce* note; with none of these, *does not reproduce* with nothing
    found. A larger run where the claim FAILs too is added to the *does not reproduce* evidence. A larger run
    counts only where it changes the same settings from its preset as this one (none, or the same values): a
    run at lr=0.03 passing says nothing of a FAIL at the preset's lr, nor the reverse."""
    by_claim: dict[tuple, list[tuple[Section, Verdict]]] = {}
    for s in sections:
        for c, v in zip(s.claims, s.verdicts()):
            if v is not None:
                by_claim.setdefault((s.run.meta.get("experiment"), c.key), []).append((s, v))

    def settings(sec: Section) -> dict[str, str]:
        return {k: show(a) for k, (a, _) in (sec.overrides or {}).items()}

    for s in sections:
        for c, v in zip(s.claims, s.verdicts()):
            if v is not Verdict.FAIL:
                continue
            larger = [(o.run, w) for o, w in by_claim.get((s.run.meta.get("experiment"), c.key), [])
                      if is_larger(o.run, s.run) and settings(o) == settings(s)]
            passing = [r for r, w in larger if w is Verdict.PASS]
            also = [r for r, w in larger if w is Verdict.FAIL]
            # An experiment's own scale explanation (its run is too short, say) does not stand against a larger
            # run of this report in which the claim FAILs too.
            explained = [f for f in c.candidates if f.kind != NOT_REPRODUCED and not (f.kind == SCALE and also)]
            if explained:
                c.failure = explained[0]
            elif passing:
                c.failure = Failure(SCALE, f"the same claim is PASS in the larger {_describe(passing[0])}; this run "
                                           f"has {count(run_scale(s.run)[1], 'step')} and {count(run_scale(s.run)[2], 'seed')}")
            elif s.overrides:
                c.failure = Failure(SETTINGS, f"this run changes {show_overrides(s.overrides, s.run)}; the claim "
                                              "is the paper's at its own settings, so this FAIL is about these ones")
            else:
                base = next((f for f in c.candidates if f.kind == NOT_REPRODUCED), None) or Failure(
                    NOT_REPRODUCED, "no oracle floor, larger run or seed interval in this report explains it")
                extra = "".join(f"; the same claim also FAILs in the larger {_describe(r)}" for r in also)
                c.failure = base._replace(evidence=base.evidence + extra)


def preset_overrides(exp, preset: str | None, cfg) -> dict[str, tuple]:
    """{field: (this run's value, its preset's)} for the config fields a run changed from the preset it names,
    leaving out what keeps the preset's protocol for the parts that run: the seed count (the intervals read it),
    where the data is read from, a subset of a list field (fewer methods, variants, lengths) and a longer run (the
    larger-run rule reads it)."""
    if preset not in getattr(exp, "PRESETS", {}):
        return {}
    longer = length_fields(exp.NAME)

    def keeps_protocol(name, mine, theirs) -> bool:
        if name == "seeds" or name in DATA_LOCATION:                  # where the data is read from: run.json's
            return True                                             # data_source and fingerprint say what it was
        if isinstance(mine, (list, tuple)) and isinstance(theirs, (list, tuple)):
            return set(mine) <= set(theirs)
        return name in longer and isinstance(mine, (int, float)) and mine >= theirs

    return {k: (a, b) for k, (a, b) in config_differences(cfg, make_config(exp, preset)).items()
            if not keeps_protocol(k, a, b)}


def show_overrides(overrides: dict[str, tuple], run: Run) -> str:
    """"lr=0.05 (cpu preset: 0.1), steps=20 (cpu preset: 1000)"."""
    preset = run.meta.get("preset")
    return ", ".join(f"{k}={show(a)} ({preset} preset: {show(b)})" for k, (a, b) in overrides.items())


def build_section(run: Run, report_dir: Path) -> Section:
    """One run's section. RunFileError (naming the file) when its run.json names no known experiment, or its
    metrics are gone although run.json says it completed."""
    try:
        exp = load(run.experiment)
    except UnknownExperiment as exc:
        raise RunFileError(f"{run.path / RUN_FILE}: {exc}") from None
    section = Section(f"{exp.TITLE}", run, report_dir)
    if run.meta.get("status") == "not run":
        section.text(f"**NOT RUN.** {run.meta.get('reason', '')}")
        return section
    try:  # a hand-edited config (seeds "two", an unknown method) was reported as 0 seeds or units not started
        cfg = stored_config(exp, run.path, run.meta)
    except (ValueError, TypeError) as exc:
        raise RunFileError(f"{run.path / RUN_FILE}: its config is not one {exp.NAME} runs: {exc}") from None
    section.overrides = preset_overrides(exp, run.meta.get("preset"), cfg)
    if not run.records and str(run.meta.get("status", "")).startswith("complete"):
        metrics = run.path / METRICS_FILE
        raise RunFileError(f"{metrics}: {'holds no records' if metrics.exists() else 'missing'}, but "
                           f"{RUN_FILE} says the run is {run.meta['status']}")
    section.progress = run_progress(exp, run)
    if not run.units() and run.diverged_units():
        section.text("**No metrics to report:** every unit diverged before its first record (listed above).")
        return section
    if not run.units():
        section.text("**No metrics to report yet:** no unit has logged a step (listed above).")
        return section
    try:
        exp.report(run, section)
    except Exception as exc:  # noqa: BLE001
        if section.complete:
            raise
        # Reports are written for finished units (e.g. methods of equal length); a partial one may not fit.
        section.blocks, section.claims = [], []
        section.text(f"**No tables yet:** the {run.experiment} report needs its units finished "
                     f"({type(exc).__name__}: {exc}); the note above says how far each got.")
    return section


def _state(section: "Section") -> str:
    """"NOT RUN", "failed" or "" from the run's status, for the headline and the contents."""
    status = str(section.run.meta.get("status", ""))
    return "NOT RUN" if status == "not run" else "failed" if status.startswith("failed") else ""


def _runs_flagged(n: int, what: str, why: str) -> str:
    """The report's headline phrase for `n` runs flagged `what` ("" for none)."""
    if not n:
        return ""
    return (f"**{count(n, 'run')} {what}** ({'their sections say' if n != 1 else 'its section says'} "
            f"{why}). ")


def failure_reason(exc: Exception) -> tuple[str, str]:
    """("read", the error naming the file) for a RunFileError or OSError; ("reported", the error named by its
    type) for an experiment's report that failed."""
    if isinstance(exc, (RunFileError, OSError)):
        return ("written" if isinstance(exc, OSError) and getattr(exc, "filename", None) and
                exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC) else "read"), str(exc)
    return "reported", f"its report failed: {type(exc).__name__}: {exc}"


def unreadable_section(path: Path, report_dir: Path, what: str, reason: str) -> Section:
    """The section of a run that could not be read or reported: why, and what to do."""
    text = (f"**Could not be {what}:** {reason}. The other runs are reported without it; repair or remove it and "
            "run `targetpo report` again (a partial last line of metrics.jsonl, as a kill leaves it, is no damage: "
            "`targetpo run NAME --out DIR --resume` cuts it off).")
    return Section(f"Run `{path.name}` (could not be {what})", Run(path, {}), report_dir, error=text)


def _section_of(path: Path, report_dir: Path, alone: bool) -> Section:
    """build_section of the run in `path`; in a report over several runs, one broken run gets a section saying
    why (and a warning on stderr) instead of stopping the report."""
    try:
        return build_section(Run.load(path), report_dir)
    except Exception as exc:  # noqa: BLE001  (any failure of one run must not hide the others)
        what, reason = failure_reason(exc)
        if alone and what in ("read", "written"):
            raise
        if alone:  # one line naming the run (a hand-edited value used to end in a traceback or a bare "zzz")
            raise RunFileError(f"{path} could not be {what}: {reason}") from exc
        print(f"warning: {path} could not be {what}: {reason}", file=sys.stderr)
        return unreadable_section(path, report_dir, what, reason)


REPORT_HEADING = "# targetpo report"  # the first line of every REPORT.md written here


def is_report(path: Path) -> bool:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(len(REPORT_HEADING)) == REPORT_HEADING


def write_report(root: str | Path, out: str | Path | None = None) -> Path:
    """Write REPORT.md for every run under `root`; returns its path. A run that cannot be read or reported gets a
    section saying why, unless `root` is that run itself: then the error is raised."""
    root = Path(root)
    runs = find_runs(root)
    if not runs:
        raise FileNotFoundError(f"no runs (directories with run.json) found in {root}")
    report_path = Path(out) if out is not None else root / "REPORT.md"
    # Checked before plots are written beside it: the rename at the end would fail after all the work.
    if report_path.is_dir():
        raise ValueError(f"-o {report_path}: is a directory; give the report's file, e.g. {report_path / 'REPORT.md'}")
    if not report_path.parent.is_dir():
        blocker = file_in_the_way(report_path.parent)
        if blocker is not None:
            raise ValueError(f"-o {report_path}: {blocker} is a file, not a folder")
        raise ValueError(f"-o {report_path}: the folder {report_path.parent} does not exist")
    if out is not None and report_path.is_file() and not is_report(report_path):  # the user's file, not ours
        raise ValueError(f"-o {report_path}: holds a file that is not a targetpo report; give another -o, or move "
                         "the file away")
    alone = runs == [root]
    sections = [_section_of(p, report_path.parent, alone) for p in runs]
    order = {name: i for i, name in enumerate(EXPERIMENTS)}  # the paper's order, as `targetpo list` shows it
    sections.sort(key=lambda s: (order.get(s.run.meta.get("experiment"), len(order)), str(s.run.path)))
    resolve_failures(sections)
    broken = sum(1 for s in sections if s.error is not None)
    states = [_state(s) for s in sections]
    failed = states.count("failed")
    incomplete = sum(1 for s, st in zip(sections, states) if not s.complete and st != "failed")
    not_run = [s.run.meta.get("experiment", s.run.path.name) for s, st in zip(sections, states) if st == "NOT RUN"]
    says, them, theirs = ("its section says", "it", "its") if len(not_run) == 1 else ("their sections say", "them",
                                                                                        "theirs")
    lines = [REPORT_HEADING, "",
             f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} from {count(len(runs), 'run')} in `{root}`. "
             + (f"**{count(len(not_run), 'experiment')} NOT RUN** ({', '.join(not_run)}: {says} why and how to "
                f"run {them}; no claim of {theirs} is counted below). " if not_run else "")
             + _runs_flagged(broken, "could not be reported", "why")
             + _runs_flagged(failed, "failed", "the error and how to resume")
             + _runs_flagged(incomplete, "incomplete", "which units are missing")
             + f"{claims_heading(sections)} checked from our data: {claim_count(sections)}. "
             "Paper numbers are the reference constants of `targetpo.paper` (the paper's tables, or runs of the "
             "authors' code where the paper gives none); every other number is measured from this run's metrics, and "
             "`mean [lo, hi]` is a seed mean with its 95 % interval over seeds (docs/verdicts.md).", ""]
    anchors = _anchors([s.title for s in sections])
    lines += ["## Contents", ""] + [f"- [{s.title}](#{a})" + (f" — {st}" if st else "")
                                    for s, a, st in zip(sections, anchors, states)] + [""]
    # Written beside and moved into place: a kill mid-write leaves the previous report, never half of one.
    tmp = report_path.with_name(report_path.name + ".tmp")
    try:
        tmp.write_text("\n".join(lines) + "\n" + "\n".join(s.render() for s in sections), encoding="utf-8")
        os.replace(tmp, report_path)
    finally:
        tmp.unlink(missing_ok=True)  # a failed write or rename leaves no stray file
    return report_path


def claims_heading(sections: list[Section]) -> str:
    """"Paper claims", or what else the tally counts (an open question's claims, headed as such in its section)."""
    own = sum(len(s.claims) for s in sections if not s.paper_claims)
    return "Paper claims" if not own else f"Claims (the paper's, and {count(own, 'claim')} of the open questions)"


def claim_count(sections: list[Section]) -> str:
    """The headline's tally, e.g. "**40 PASS, 11 FAIL (5 scale or data, 2 seed noise, 4 does not reproduce),
    5 inconclusive** over the cpu and paper presets; 12 claims n/a on smoke runs": verdicts only from the complete
    runs of the presets that can test a claim, the rest (other presets, incomplete runs) counted apart. Call
    resolve_failures first to class the FAILs."""
    judged = [s for s in sections if s.gives_verdicts and s.complete]
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
    elif any(s.gives_verdicts for s in sections):
        parts.append(f"no verdicts (no {' or '.join(VERDICT_PRESETS)} run is complete)")
    else:
        parts.append(f"no verdicts (only the {' and '.join(VERDICT_PRESETS)} presets can test a claim)")
    unjudged: dict[str, int] = {}
    for s in sections:
        if s.claims and not (s.gives_verdicts and s.complete):
            kind = "incomplete" if not s.complete else str(s.run.meta.get("preset"))
            unjudged[kind] = unjudged.get(kind, 0) + len(s.claims)
    parts += [f"{count(n, 'claim')} n/a on {p} runs" for p, n in unjudged.items()]
    diverged = sum(len(s.run.diverged_units()) for s in sections)
    if diverged:
        parts.append(f"{count(diverged, 'unit')} diverged (listed in their sections)")
    return "; ".join(parts)


def _anchor(title: str) -> str:
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return keep.replace(" ", "-")


def _anchors(titles: list[str]) -> list[str]:
    """The link target of each `## title` heading in order: a repeated title (two runs of one experiment) gets
    -1, -2, ... as GitHub and most Markdown renderers number repeated headings."""
    seen: dict[str, int] = {}
    out = []
    for title in titles:
        base = _anchor(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.append(base if n == 0 else f"{base}-{n}")
    return out
