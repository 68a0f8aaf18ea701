"""What hubgym shows a person: rich tables, failure reports, progress bars. Used by the `hubgym` command and
the main job (hubgym.app.pipeline) alike; it imports neither.

Every cell that holds text from an env (names, messages) is a `rich.text.Text`, so brackets in
messages such as `[env='x' split='train']` are printed as they are, never read as markup.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from rich import box
from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from hubgym.schemas.text import plain
from hubgym.envs.catalog import EnvEntry, count_rows, split_of

if TYPE_CHECKING:
    from hubgym.conformance import CheckResult

def folded(table: Table) -> Table:
    """`table` with every column folding (wrapping) its header and cells instead of cutting them with an ellipsis."""
    for column in table.columns:
        column.overflow = "fold"
    return table


PASS, FAIL, SKIP = Text("pass", style="green"), Text("FAIL", style="bold red"), Text("skip", style="yellow")


CONFIGS_SHOWN = 3
DESCRIPTION_ROOM = 30
"""Characters of description a line keeps before the other columns are cut to their caps."""
CATALOG_COLUMNS = (("env", 32), ("kind", 11), ("source", 13), ("configs", 28), ("tags", 24), ("tools", 20),
                   ("description", 200))
"""Config names a catalog line shows before it counts the rest: `easy, medium, hard +2`."""


def catalog_table(entries: list[EnvEntry], width: int = 160) -> Group:
    """One line per env in `width` columns, so hundreds of rows stay readable: long config lists end in a count,
    long text is cut with an ellipsis. Envs and families that failed to load are listed below with their error.

    Laid out here rather than by rich's Table: every line has the same fixed columns, and measuring 1500 rows
    cell by cell took rich most of a second, which `hubgym envs` cannot spend."""
    by_source: dict[str, int] = {}
    for e in entries:
        by_source[e.source] = by_source.get(e.source, 0) + 1
    title = f"hubgym environments: {len(entries)} (" + ", ".join(f"{n} {s}" for s, n in by_source.items()) + ")"
    rows = [(e.name, "unavailable", e.source, "", "", "", "") if e.error else
            (e.name, e.kind, e.source, short_list(e.configs), ", ".join(e.tags) or "-", ", ".join(e.tools) or "-",
             e.description) for e in entries]
    natural = [max([len(column), *(len(row[i]) for row in rows)]) for i, (column, _) in enumerate(CATALOG_COLUMNS)]
    fits = _catalog_line_width(natural[:-1]) + 3 + DESCRIPTION_ROOM < width  # else each column up to its cap;
    # the description gets the rest of the line, and is left out below 12 characters
    widths = natural if fits else [min(n, widest) for n, (_, widest) in zip(natural, CATALOG_COLUMNS)]
    room = width - 1 - _catalog_line_width(widths[:-1]) - 3
    columns = len(widths) if room >= 12 else len(widths) - 1
    widths[-1] = min(room, widths[-1])
    widths, rows = widths[:columns], [row[:columns] for row in rows]
    text = Text(title if entries else "hubgym environments: none match", style="italic")
    text.append("\n\n")
    text.append(_catalog_line([c for c, _ in CATALOG_COLUMNS], widths, width) + "\n", style="bold")
    text.append("  " + "─" * min(_catalog_line_width(widths) - 2, width - 3) + "\n")
    for e, row in zip(entries, rows):
        line = _catalog_line(row, widths, width)
        text.append(line[:widths[0] + 2], style="bold")
        text.append(line[widths[0] + 2:] + "\n", style="red" if e.error else "")
    notes = [Text.assemble((f"{e.name}: ", "bold red"), (e.error or "", "red")) for e in entries if e.error]
    return Group(text, *notes)


def _catalog_line(cells: list[str] | tuple[str, ...], widths: list[int], width: int) -> str:
    """Cells padded or cut (with …) to their column's width, 3 spaces apart, indented 2; the line cut to `width`
    (a terminal too narrow for the fixed columns loses the last ones, never the one-line-per-env layout)."""
    line = "  " + "   ".join(_fit(cell, w) for cell, w in zip(cells, widths)).rstrip()
    return line if len(line) < width else _fit(line, width - 1)


def _fit(cell: str, width: int) -> str:
    return cell.ljust(width) if len(cell) <= width else cell[:width - 1] + "…"


def _catalog_line_width(widths: list[int]) -> int:
    return 2 + sum(widths) + 3 * (len(widths) - 1)


def short_list(items: list[str], shown: int = CONFIGS_SHOWN) -> str:
    """`a, b, c +4` for seven items: the first few, then how many more."""
    more = len(items) - shown
    return ", ".join(items[:shown]) + (f" +{more}" if more > 0 else "")


def files_table(files: Iterable[Path], title: str) -> Table:
    """Built files with the split each holds and its row count (read back from the file)."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for column, justify in (("config", "left"), ("split", "left"), ("rows", "right"), ("file", "left")):
        table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for path in files:
        table.add_row(path.parent.name, split_of(path), str(count_rows(path)), Text(str(path)))
    return table


def checks_table(results: list[CheckResult]) -> Table:
    table = Table(title="conformance", title_justify="left", box=box.SIMPLE_HEAD)
    for column, justify in (("env", "left"), ("check", "left"), ("status", "left"), ("seconds", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for r in results:
        table.add_row(Text(r.env), Text(r.check), PASS if r.ok else SKIP if r.skipped else FAIL, f"{r.seconds:.2f}")
    return folded(table)


def failures(results: list[CheckResult]) -> Group:
    """Every failure message in full, under a header naming the env and the check; then each skipped check's
    reason (what failed before it), dimmed."""
    parts: list[Text] = []
    for r in sorted((r for r in results if not r.ok), key=lambda r: r.skipped):
        label = ("SKIP ", "yellow") if r.skipped else ("FAIL ", "bold red")
        parts += [Text.assemble(label, (f"{r.env} / {r.check}", "bold")), Text(r.message, style="dim" * r.skipped),
                  Text("")]
    return Group(*parts)


def checks_verdict(results: list[CheckResult]) -> str:
    """'2 of 19 checks failed, 5 skipped' / 'all 19 checks passed' / '18 of 19 checks passed, 1 skipped'."""
    failed, skipped = sum(r.failed for r in results), sum(r.skipped for r in results)
    also = f", {skipped} skipped" if skipped else ""
    if failed:
        return f"{failed} of {len(results)} checks failed{also}"
    if skipped:
        return f"{len(results) - skipped} of {len(results)} checks passed{also}"
    return f"all {len(results)} checks passed"


@dataclass(frozen=True)
class EnvSummary:
    """One line of the demo summary."""

    env: str
    kind: str
    rows: int
    passed: int
    total: int
    seconds: float


def summary_table(rows: list[EnvSummary]) -> Table:
    table = Table(title="summary", title_justify="left", box=box.SIMPLE_HEAD)
    for column, justify in (("env", "left"), ("kind", "left"), ("rows", "right"), ("checks", "right"),
                            ("seconds", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        style = "green" if r.passed == r.total else "red"
        table.add_row(Text(r.env), r.kind, str(r.rows), Text(f"{r.passed}/{r.total}", style=style), f"{r.seconds:.1f}")
    return folded(table)


def with_progress(console: Console, names: list[str], work: Callable[[str], Iterable[CheckResult]],
                  verb: str = "checking", steps: int = 1) -> list[CheckResult]:
    """Run `work(name)` for each env under a progress bar of `steps` results per env, naming the check
    just finished when `work` yields results one by one. An exception becomes one failure row."""
    results: list[CheckResult] = []
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task(verb, total=len(names) * steps)
        for done, name in enumerate(names, start=1):
            progress.update(bar, description=f"{verb} {name}")
            started = time.perf_counter()
            try:
                for result in work(name):
                    results.append(result)
                    progress.update(bar, advance=1, description=f"{verb} {name}: {result.check} done")
            except Exception as exc:  # one broken env is a failure row, not the end of the run
                from hubgym.conformance.runner import CheckResult as Result

                results.append(Result.failure(name, "load", exc, started))
            progress.update(bar, completed=done * steps)
    return results


def frame_table(frame, title: str) -> FrameTable:
    """A polars DataFrame as a rich table (floats to 3 decimals, rates as they are) that never cuts a column name:
    when its columns do not fit the width it is printed at, it is printed turned, one line per column. Its text
    (stored env and metric names, ids) is printed `plain`: control characters escaped."""
    header = [plain(name) for name in frame.columns]
    rows = [[f"{v:.3f}" if isinstance(v, float) else "-" if v is None else plain(v) for v in row]
            for row in frame.iter_rows()]
    return FrameTable(title, header, rows)


@dataclass(frozen=True)
class FrameTable:
    """The table of `frame_table`, laid out when the console's width is known."""

    title: str
    header: list[str]
    rows: list[list[str]]

    def __rich_console__(self, console: Console, options: Any) -> Iterator[Table]:
        widths = [max([len(h)] + [len(r[i]) for r in self.rows]) for i, h in enumerate(self.header)]
        turned = max(widths) + sum(max(len(r[i]) for i in range(len(r))) for r in self.rows) + 3 * len(self.rows) + 4
        if sum(widths) + 3 * len(widths) + 1 <= options.max_width:
            yield self._wide()
        elif turned <= options.max_width:
            yield self._turned()
        else:  # narrower still: one two-column table per row
            yield from self._stacked()

    def _wide(self) -> Table:
        table = Table(title=self.title, box=box.SIMPLE_HEAVY)
        for name in self.header:
            table.add_column(name, justify="left" if name == "env" else "right", overflow="fold")
        for row in self.rows:
            table.add_row(*map(Text, row))
        return table

    def _stacked(self) -> Iterator[Table]:
        for row in self.rows:
            table = Table(title=f"{self.title}: {row[0]}", box=box.SIMPLE_HEAVY, show_header=False)
            table.add_column(justify="left", no_wrap=True)
            table.add_column(justify="right", overflow="fold")
            for name, value in list(zip(self.header, row))[1:]:
                table.add_row(Text(name), Text(value))
            yield table

    def _turned(self) -> Table:
        """One line per column (its name, then each row's value): what no terminal width cuts."""
        first = self.header[0] if self.header and self.header[0] == "env" else None
        table = Table(title=self.title, box=box.SIMPLE_HEAVY)
        table.add_column(first or "", justify="left", no_wrap=True)
        for row in self.rows:
            table.add_column(row[0] if first else "", justify="right", overflow="fold")
        for i, name in enumerate(self.header[1:] if first else self.header, start=1 if first else 0):
            table.add_row(Text(name), *(Text(row[i]) for row in self.rows))
        return table


@contextmanager
def rows_progress(console: Console, verb: str) -> Iterator[Callable[[int, Optional[int]], None]]:
    """A rich bar fed with (rows done, total rows or None); the total shows once it is known."""
    columns = (TextColumn(f"[bold]{verb}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task(verb, total=None, rate="")
        started = time.perf_counter()

        def advance(rows: int, total: Optional[int]) -> None:
            done = progress.tasks[0].completed + rows
            rate = done / max(time.perf_counter() - started, 1e-9)
            progress.update(bar, total=total, completed=done, rate=f"{rate:,.0f} rows/s")

        yield advance


def before_after_table(before: dict[str, float], after: dict[str, float],
                       middle: tuple[str, dict[str, float]] | None = None) -> Table:
    """eval/<env>/<metric> before and after training, one row per env and metric; `middle`, (title, metrics) of an
    evaluation between them (after the offline stage), is a column of its own when it holds any."""
    between = middle if middle and middle[1] else None
    table = Table("env", "metric", "before", *([between[0]] if between else []), "after", "change",
                  title="held-out evaluation", box=None)
    for key in sorted(after):
        _, env, metric = key.split("/", 2)
        old, new = before.get(key), after[key]
        change = f"{new - old:+.3f}" if old is not None and new is not None else "-"
        table.add_row(env, metric, _number(old), *([_number(between[1].get(key))] if between else []),
                      _number(new), change)
    return folded(table)


def _number(value: float | None) -> str:
    """A metric no row could give (every eval rollout of the env failed) shows as '-'."""
    return "-" if value is None else f"{value:.3f}"


def replay_tables(report) -> list[Table]:
    """Counts per env, then the first divergences and the first token-audit failures (20 each)."""
    counts = Table("env", *(k.replace("_", " ") for k in report.counts()), title="replay", box=None)
    for env in sorted({r.env for r in report.results}):
        counts.add_row(plain(env), *map(str, report.counts(env).values()))
    tables = [counts]
    if report.diverged:
        table = Table("rollout", "env", "turn", "field", "stored", "replayed", title="first divergences", box=None)
        for r in report.diverged[:20]:
            d = r.divergence
            table.add_row(plain(r.rollout_id), plain(r.env), str(d.turn), plain(d.field),
                          *_where_they_differ(d.stored, d.replayed))
        tables.append(table)
    if report.token_failures:
        table = Table("rollout", "env", "token", "turn", "part", "stored", "template renders",
                      title="token audit: first token the chat template does not produce", box=None)
        for r in report.token_failures[:20]:
            a = r.audit
            table.add_row(plain(r.rollout_id), plain(r.env), f"{a.index}/{a.tokens}", str(a.turn), plain(a.part),
                          _near(a.stored), _near(a.rendered))
        tables.append(table)
    return [folded(t) for t in tables]


def _where_they_differ(stored, replayed, width: int = 24) -> tuple[str, str]:
    """Two values as short reprs; two texts cut to where they part ways (long observations share a head)."""
    if not (isinstance(stored, str) and isinstance(replayed, str)):
        return repr(stored), repr(replayed)
    at = next((i for i, (a, b) in enumerate(zip(stored, replayed)) if a != b), min(len(stored), len(replayed)))
    return tuple(_near(text[:at] + "⟨here⟩" + text[at:], width) for text in (stored, replayed))


def _near(text: str, width: int = 24) -> str:
    """`width` characters each side of the ⟨here⟩ mark, as a repr (newlines and specials stay visible)."""
    head, _, tail = text.partition("⟨here⟩")
    return ("…" if len(head) > width else "") + repr(head[-width:] + "⟨here⟩" + tail[:width]) + (
        "…" if len(tail) > width else "")
