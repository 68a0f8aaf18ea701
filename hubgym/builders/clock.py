"""Fake clocks: run code as if it were another moment in another time zone.

    with at_clock(PINNED_CLOCK):        # date.today(), datetime.now(), time.time() and the local zone
        item = dataset[i]               # are 2025-01-01 12:00 UTC, moving on with real time from there

Two users. A bridge pins the clock around a wrapped generator that reads the date (reasoning-gym's
`time_intervals` calls `date.today()`), so its rows are the same on every day. The conformance checker
builds and scores an env under two very different clocks (`CHECK_CLOCKS`) to catch any that reads it.

time-machine patches the clock of the whole process (every thread) for the length of the block, and
sets TZ when the moment carries a zone; keep blocks short, around the code that needs them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime
from typing import Iterator
from zoneinfo import ZoneInfo


@dataclass(frozen=True)
class Clock:
    """A moment and a time zone (an IANA name), as `at_clock` sets them."""

    moment: str  # ISO 8601 local time, e.g. "2031-05-17T09:30:00"
    zone: str  # e.g. "Pacific/Kiritimati"

    def __str__(self) -> str:
        return f"{self.moment.replace('T', ' ')} {self.zone}"

    def datetime(self) -> datetime:
        return datetime.fromisoformat(self.moment).replace(tzinfo=ZoneInfo(self.zone))


PINNED_CLOCK = Clock("2025-01-01T12:00:00", "UTC")
"""The moment a clock-reading generator is pinned to (a bridge's spec records it)."""

CHECK_CLOCKS = (Clock("2031-05-17T09:30:00", "Pacific/Kiritimati"), Clock("2003-02-03T22:15:00", "America/Adak"))
"""The two clocks `hubgym check` builds and scores under: different years, months, days, hours and zones
(UTC+14 and UTC-10), so a row or reward that reads any of them differs between the two."""


@contextlib.contextmanager
def at_clock(clock: Clock | None) -> Iterator[None]:
    """Run the block under `clock` (the real clock when None); the clock moves on with real time."""
    if clock is None:
        yield
        return
    import time_machine

    with time_machine.travel(clock.datetime(), tick=True):
        yield
