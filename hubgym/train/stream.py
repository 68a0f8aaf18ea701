"""Rollout rows from any mix of sources -> complete GRPO groups, in bounded memory, resumable.

    stream = GroupStream([LocalShards("runs/a"), hub_rows], GroupSettings(n=8),
                         env_weights={"arithmetic": 2.0, "wordle": 1.0}, seed=0)
    group = stream.next_group()      # Group(env, key, rows, advantages, weight, ...); None when all is read
    state = stream.state()           # JSON-able: rows read per source, RNG, buffered groups, counts
    again = GroupStream(<the same sources, from their start>, GroupSettings(n=8), {...}, seed=0)
    again.restore(state)             # from here on, `again` yields exactly what `stream` would have
    stream.counts                    # groups, skipped rows by field, short / zero-variance groups, ...
    GroupStream(sources, settings, on_row=seen.append)   # also hands over every row read, trainable or not

A source is any iterable of rollout row dicts (a LocalShards reader, the Hub reader, the online
producer's rows). Sources are read round robin, one row each per round, so none runs ahead of the
others. A row joins the incomplete group of its `group` key; at `n` rows the group is complete and
waits, with its advantages (groups.py), in its env's ready queue. The next group is drawn by env
weight (seeded) among the envs that can still give one (with `env_weights`, also configured envs
not seen yet while sources remain), then rows are read until that env has a ready group, so a
mixture trains in proportion whatever order the rows come in, within the read-ahead bound.

Memory stays flat whatever the sources hold: at most `buffer_groups` incomplete groups (beyond
that the oldest is closed as short), and reading ahead stops at `buffer_groups` ready groups (a
ready env is then drawn instead, still by weight).

Rows that cannot train (failed, unscored, a token record whose lengths disagree or that is not
prefix-consistent, a duplicate sample, an env outside the mixture) are skipped with a warning
naming env, rollout id and field, and counted under `skipped_rows/<field>`; strict mode raises.

Resume: `state()` records how many rows were read from each source, the RNG, the counts and,
for every buffered row, *where* it came from (source, position) rather than the row itself, so a
checkpoint stays small. `restore()` reads fresh sources up to those positions and keeps only the
buffered rows; a source with a `skip(n)` method (LocalShards) skips whole record batches unread.
"""

from __future__ import annotations

import logging
import random
from collections import Counter, OrderedDict, deque
from dataclasses import asdict
from typing import Any, Callable, Iterable, Iterator

from hubgym.errors import BadRowError
from hubgym.train.config import ConfigError
from hubgym.schemas.row_contract import group_mismatch, row_breach
from hubgym.train.groups import Group, GroupSettings, bad_field, make_group

log = logging.getLogger("hubgym.train")

Entry = tuple[int, int, dict]  # (source index, row position in that source, row)
_END = object()
STATE_VERSION = 1
WARNINGS_PER_FIELD = 3  # then only counted: a bad run must not flood the log


class GroupStream:
    def __init__(self, sources: Iterable[Iterable[dict[str, Any]]], settings: GroupSettings,
                 env_weights: dict[str, float] | None = None, seed: int = 0,
                 on_row: Callable[[dict[str, Any]], None] | None = None):
        self._sources = [iter(s) for s in sources]
        self._live = list(range(len(self._sources)))  # sources not yet exhausted
        self.positions = [0] * len(self._sources)  # rows read so far from each source
        self.settings = settings
        self.env_weights = dict(env_weights) if env_weights is not None else None
        for env, weight in (self.env_weights or {}).items():
            if not weight > 0:
                raise ConfigError(f"env {env!r} has mixture weight {weight}; weights must be > 0 "
                                  f"(leave the env out of `envs` to train without it)")
        self.rng = random.Random(seed)
        self.on_row = on_row
        self.counts: Counter[str] = Counter()
        self.peak_pending = 0  # most incomplete groups held at once (never above settings.buffer_groups)
        self._pending: OrderedDict[str, list[Entry]] = OrderedDict()  # incomplete groups, oldest first
        self._ready: dict[str, deque[Group]] = {}
        self._known: set[str] = set()  # envs seen in trainable rows so far

    def __iter__(self) -> Iterator[Group]:
        while (group := self.next_group()) is not None:
            yield group

    # -- drawing groups ---------------------------------------------------------------------------

    def next_group(self) -> Group | None:
        """The next complete group, its env drawn by weight (seeded), or None when every source is done."""
        while True:
            if not self._known and self._live:
                self._pull_round()
                continue
            expected = set(self.env_weights or ()) if self._live else set()  # configured envs may still come
            candidates = sorted(e for e in self._known | expected if self._ready.get(e) or self._live or self._pending)
            if not candidates:
                return None
            env = self._draw(candidates)
            while not self._ready.get(env) and self._live and self._ready_total() < self.settings.buffer_groups:
                self._pull_round()
            if not self._ready.get(env) and not self._live:
                for key in list(self._pending):  # every source ended: what is left is short
                    self._close(key)
            if not self._ready.get(env):
                if not self._live:  # this env has nothing more to give
                    self._known.discard(env)
                    continue
                env = self._draw(self._ready_envs())  # read-ahead bound hit: serve a ready env
            self.counts["groups"] += 1
            return self._ready[env].popleft()

    def _draw(self, envs: list[str]) -> str:
        weights = [self.env_weights[e] if self.env_weights else 1.0 for e in envs]
        return self.rng.choices(envs, weights=weights)[0]

    def _ready_total(self) -> int:
        return sum(len(q) for q in self._ready.values())

    def _ready_envs(self) -> list[str]:
        return sorted(e for e, q in self._ready.items() if q)

    @property
    def buffered(self) -> dict[str, int]:
        """What the stream holds now: incomplete groups, ready groups, and their rows."""
        rows = sum(map(len, self._pending.values())) + sum(len(g.rows) for q in self._ready.values() for g in q)
        return {"pending_groups": len(self._pending), "ready_groups": self._ready_total(), "rows": rows}

    # -- reading rows -----------------------------------------------------------------------------

    def _pull_round(self) -> None:
        """One row from each live source (round robin): sources interleave, none is read ahead."""
        for i in list(self._live):
            row = next(self._sources[i], _END)
            if row is _END:
                self._live.remove(i)
                continue
            position = self.positions[i]
            self.positions[i] += 1
            if self.on_row is not None:
                self.on_row(row)
            self._add((i, position, row))

    def _add(self, entry: Entry) -> None:
        row = entry[2]
        env = row.get("env") or "?"
        if self.env_weights is not None and env not in self.env_weights:
            self._bad(row, "env", f"env {env!r} is not in the training config's envs "
                                  f"({', '.join(sorted(self.env_weights))}); add it under `envs` or drop the source",
                      strict=self.settings.strict or self.settings.unknown_env == "error")
            return
        bad = bad_field(row, self.settings.objective)
        if bad == "completion_logprobs" and not row.get("completion_logprobs"):
            raise BadRowError(f"env {env!r}, rollout {row.get('rollout_id')!r} has no behaviour logprobs (an imported "
                              f"run, or another model's samples): GRPO weighs each token by the policy's ratio to "
                              f"them; train such rows with offline.loss=sft", env=env,
                              rollout_id=row.get("rollout_id"), field="completion_logprobs")
        if bad:
            self._bad(row, bad, _why(row, bad))
            return
        key = row["group"]
        entries = self._pending.get(key, [])
        if row.get("sample") is not None and any(e[2].get("sample") == row["sample"] for e in entries):
            self._bad(row, "sample", f"sample {row['sample']} of group {key!r} was already read (the same run "
                                     f"listed twice, or duplicated rows?); list each run once")
            return
        other = group_mismatch(entries[0][2], row) if entries else None
        if other is not None:  # a group is the samples of one task of one run (the row contract's group rule)
            self._bad(row, other.column, f"group {key!r} already holds {other.column} "
                                         f"{entries[0][2].get(other.column)!r}, this row {row.get(other.column)!r}: "
                                         f"breaks rule {other.name}; rows of two tasks never share a group key")
            return
        self._known.add(env)
        entries.append(entry)
        self._pending[key] = entries
        if len(entries) >= self.settings.n:
            self._finish(self._pending.pop(key))
        while len(self._pending) > self.settings.buffer_groups:  # bounded memory: the oldest group is short
            self._close(next(iter(self._pending)))
        self.peak_pending = max(self.peak_pending, len(self._pending))

    def _bad(self, row: dict[str, Any], field: str, why: str, strict: bool | None = None) -> None:
        env, rollout = row.get("env"), row.get("rollout_id")
        message = f"env {env!r}, rollout {rollout!r}, field {field!r}: {why}"
        if self.settings.strict if strict is None else strict:
            raise BadRowError(f"{message} (strict mode; set grpo.strict=false to skip and count such rows)",
                              env=env, rollout_id=rollout, field=field)
        self.counts[f"skipped_rows/{field}"] += 1
        if self.counts[f"skipped_rows/{field}"] <= WARNINGS_PER_FIELD:
            log.warning("skipped a rollout row: %s", message)

    def _close(self, key: str) -> None:
        """A group that will not complete (sources ended, or pushed out of the buffer): the short-group policy."""
        entries = self._pending.pop(key)
        env = entries[0][2].get("env")
        if self.settings.short_groups == "error" and self.settings.objective != "sft":
            raise BadRowError(f"group {key!r} of env {env!r} has {len(entries)} rows, expected n={self.settings.n}; "
                              f"set grpo.short_groups to drop or keep, or raise batch.buffer_groups if the "
                              f"group's rows are far apart in the sources", env=env, field="group")
        self.counts["short_groups"] += 1
        if self.settings.objective == "sft" or (self.settings.short_groups == "keep" and len(entries) >= 2):
            self._finish(entries)  # sft: every row trains on its own
        else:  # one row has no group-relative signal
            self.counts["dropped_groups/short"] += 1

    def _finish(self, entries: list[Entry]) -> None:
        group = make_group([e[2] for e in entries], self.settings, self.counts, [(e[0], e[1]) for e in entries])
        if group is not None:
            self._ready.setdefault(group.env, deque()).append(group)

    # -- resume -----------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything needed to continue exactly from here, JSON-able and small (positions, not rows)."""
        version, internal, gauss = self.rng.getstate()
        return {
            "version": STATE_VERSION,
            "settings": asdict(self.settings),
            "env_weights": self.env_weights,
            "positions": list(self.positions),
            "live": list(self._live),
            "rng": [version, list(internal), gauss],
            "counts": dict(self.counts),
            "known": sorted(self._known),
            "peak_pending": self.peak_pending,
            "pending": [[key, [[s, p] for s, p, _ in entries]] for key, entries in self._pending.items()],
            "ready": {env: [[list(ref) for ref in g.refs] for g in q] for env, q in sorted(self._ready.items()) if q},
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from `state()`; call on a new stream over the same sources, read from their start."""
        if any(self.positions) or self._pending or self._ready:
            raise ValueError("restore() needs a fresh GroupStream (this one has already read rows)")
        if state.get("version") != STATE_VERSION or len(state["positions"]) != len(self._sources):
            raise ValueError(f"stream state (version {state.get('version')}, {len(state['positions'])} sources) "
                             f"does not fit this stream (version {STATE_VERSION}, {len(self._sources)} sources); "
                             f"restore with the same sources, in the same order")
        changed = [k for k, v in asdict(self.settings).items() if state["settings"].get(k) != v]
        if changed:
            raise ValueError(f"the stream state was saved with other group settings ({', '.join(changed)}); "
                             f"resume with the settings of the checkpointed run")
        if state.get("env_weights") != self.env_weights:
            log.warning("resuming the stream with other env weights (%s, saved: %s): the groups drawn from here on "
                        "differ from the uninterrupted run's", self.env_weights, state.get("env_weights"))
        wanted: dict[int, set[int]] = {i: set() for i in range(len(self._sources))}
        for _, refs in state["pending"]:
            for s, p in refs:
                wanted[s].add(p)
        for groups in state["ready"].values():
            for refs in groups:
                for s, p in refs:
                    wanted[s].add(p)
        rows: dict[tuple[int, int], dict] = {}
        for i, target in enumerate(state["positions"]):
            rows.update({(i, p): row for p, row in _read_back(self._sources[i], i, target, wanted[i]).items()})
        self.positions, self._live = list(state["positions"]), list(state["live"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.counts = Counter(state["counts"])
        self._known, self.peak_pending = set(state["known"]), state["peak_pending"]
        self._pending = OrderedDict((key, [(s, p, rows[(s, p)]) for s, p in refs]) for key, refs in state["pending"])
        scratch: Counter[str] = Counter()  # these groups were counted when first made
        for env, groups in state["ready"].items():
            queue = self._ready.setdefault(env, deque())
            for refs in groups:
                group = make_group([rows[(s, p)] for s, p in refs], self.settings, scratch, [(s, p) for s, p in refs])
                if group is None:
                    raise ValueError(f"a buffered group of env {env!r} no longer forms a group: the sources changed "
                                     f"since the checkpoint")
                queue.append(group)


def _read_back(source: Iterator[dict], index: int, target: int, wanted: set[int]) -> dict[int, dict]:
    """Advance `source` to row `target`, returning the rows at the `wanted` positions."""
    position = min(wanted, default=target)
    skip = getattr(source, "skip", None)
    if skip is not None:
        skipped = skip(position)
    else:
        skipped = sum(1 for _ in zip(range(position), source))
    got: dict[int, dict] = {}
    while skipped < target:
        row = next(source, _END)
        if row is _END:
            break
        if skipped in wanted:
            got[skipped] = row
        skipped += 1
    if skipped < target:
        raise ValueError(f"source {index} has {skipped} rows but the stream state had read {target}: the sources "
                         f"changed since the checkpoint; restore with the same sources, in the same order")
    return got


def _why(row: dict[str, Any], field: str) -> str:
    """Why a row's field makes it untrainable, and what to do."""
    breach = row_breach(row)
    if breach is not None and breach.column == field:
        return f"{breach.message()}; no hubgym writer writes such a row: fix or leave out the source that made it"
    n = len(row.get("completion_ids") or [])
    if field == "error":
        e = row["error"] or {}
        return (f"the row failed ({e.get('boundary')}: {e.get('type')}: {e.get('message')}); a failed row is left out "
                f"of the advantages")
    if field == "reward":
        return f"reward is {row.get('reward')!r}, not a finite number; re-score the run (hubgym score)"
    if field == "group":
        return "no GRPO group key; rows written by hubgym's rollout runner always have one"
    if field in ("prompt_ids", "completion_ids"):
        return f"{field} is empty: the engine returned no token ids, so there is nothing to train on"
    if field in ("completion_mask", "completion_logprobs"):
        return (f"{field} has {len(row.get(field) or [])} entries but completion_ids has {n}: the token record "
                f"is inconsistent; re-run this rollout")
    return ("tokens_consistent is false: the stored ids are not a prefix-consistent record of the conversation, "
            "so training on them would teach tokens in a context the model never saw")
