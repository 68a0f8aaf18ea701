"""Rewrite one benchmark's section of bench/RESULTS.md, keeping the rest of the file (and notes) as they are.

    write_section("## Training step: hubgym vs a bare DeepSpeed loop", body)

A section runs from its `## ` heading to the next one. Hand-written notes placed after a NOTES
marker inside the section survive a re-run: they are put back below the new body.
"""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
NOTES = "<!-- notes: kept when the table above is regenerated -->"
PREAMBLE = "# Benchmarks\n\nNumbers from the scripts under `bench/`; each section says how to reproduce it.\n"


def write_section(heading: str, body: str, path: Path = RESULTS) -> None:
    """Replace the section under `heading` with `body` (the text below the heading), or append it."""
    text = path.read_text() if path.exists() else PREAMBLE
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip("\n") == heading), None)
    if start is None:
        path.write_text(f"{text.rstrip()}\n\n{heading}\n\n{body.strip()}\n")
        return
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    old = "".join(lines[start:end])
    notes = f"\n{old[old.index(NOTES):].strip()}\n" if NOTES in old else ""
    tail = "".join(lines[end:])
    path.write_text("".join(lines[:start]) + f"{heading}\n\n{body.strip()}\n{notes}" + (f"\n{tail}" if tail else ""))
