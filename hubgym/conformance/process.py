"""The checks that a reward, and a step, depend on the task and the trajectory, not on the process that scores them.

A stored rollout is re-scored in other processes, on other machines, long after: a reward that follows the
process would give another number there. Four ways a process leaks into a reward that the other checks miss:

- its hash seed (`hash()` of a string, the order of a set of strings): the samples are scored again in a second
  process with another PYTHONHASHSEED (the one that rebuilds the env, hubgym.conformance.rebuild);
- its environment variables: the variables a freshly imported verifier reads (at import and while scoring) are
  set to '0', to '1' and unset in turn, and the samples scored again on another fresh import each time;
- its age: a fresh import scores one sample again and again, LONG_RUN_CALLS times (or for LONG_RUN_SECONDS), with
  the golden cases every LONG_RUN_PERIOD calls: state that changes an answer only after thousands of calls shows;
- its global random state: every scoring the checker makes notes whether the `random` module's generator (or
  numpy's global one) moved while the verifier ran: a draw is a dependence, however rarely it changes a result.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from hubgym.conformance.common import CheckSkipped, Sample, fail, same_score, score_summary, score_with
from hubgym.verifiers.contract import Score

if TYPE_CHECKING:
    from hubgym.conformance.context import Context

PROCESS_SAMPLES = 24  # samples the hash-seed and environment checks score again (the golden cases come on top)
LONG_RUN_CALLS, LONG_RUN_SECONDS, LONG_RUN_PERIOD = 5_000, 2.0, 1_000  # calls, or as many as fit in 2 s
IGNORED_VARIABLES = frozenset({"TZ"})  # the clock checks own the time zone
_SEEDED_FIX = ("draw from a generator of the row's own (random.Random(task['info']['seed']), "
               "numpy.random.default_rng(seed)), never from the random module's functions or numpy.random's")


def process_samples(ctx: Context) -> list[Sample]:
    """The first PROCESS_SAMPLES built-row samples, in order, and every golden case."""
    built = [s for s in ctx.samples if s.config is not None]
    return built[:PROCESS_SAMPLES] + [s for s in ctx.samples if s.config is None]


def _repeatable(ctx: Context) -> None:
    """These checks compare scorings: they mean something only where scoring repeats within one process (what
    check_scoring_deterministic holds an env to)."""
    if any(not same_score(first, again) for (_, first, _), (_, scores) in zip(ctx.scored(1), ctx.rescored())
           for again in scores):
        raise CheckSkipped.because("scores that repeat", "check_scoring_deterministic", ctx.where(), ctx.check)


# -- the hash seed ------------------------------------------------------------------------------------------

def check_scoring_independent_of_hash_seed(ctx: Context) -> None:
    """Samples scored in a second process, whose PYTHONHASHSEED differs, score as they score here."""
    _repeatable(ctx)
    samples = process_samples(ctx)
    theirs = ctx.hash_seed_scores(samples)
    ours = {id(sample): score for sample, score, _ in ctx.scored(1)}
    for sample, other in zip(samples, theirs):
        mine = ours.get(id(sample)) or score_with(ctx.verifier, sample)
        if not same_score(mine, other):
            fail(f"scoring {sample.label} in a second process with another hash seed ({ctx.hash_seeds}) gave "
                 f"{score_summary(other)}, but here {score_summary(mine)}; most likely a reward or step uses hash() "
                 f"of a string (or follows the order of a set of strings), which Python seeds anew in every process",
                 ctx.where(sample.config, sample.split, sample.task.get("id"), "verifier"),
                 "derive numbers from text with hashlib or zlib.crc32, and iterate over sorted(...) collections; "
                 "never hash() of a str or bytes")


# -- environment variables ----------------------------------------------------------------------------------

class _RecordingEnviron(type(os.environ)):  # type: ignore[misc]
    """os.environ's own class, noting every key read (os.getenv and `from os import environ` included)."""

    def __getitem__(self, key: str) -> str:
        _READ.append(key)
        return super().__getitem__(key)


_READ: list[str] = []


@contextmanager
def variables_read() -> Iterator[list[str]]:
    """The environment variables read while the block runs (os.environ's class is swapped, then restored)."""
    original = type(os.environ)
    start = len(_READ)
    found: list[str] = []
    os.environ.__class__ = _RecordingEnviron
    try:
        yield found
    finally:
        os.environ.__class__ = original
        found.extend(dict.fromkeys(k for k in _READ[start:] if k not in IGNORED_VARIABLES))
        del _READ[start:]


VARIANTS = ("0", "1", None)
"""What the variables a verifier reads are set to, in turn (None: unset): a setting that defaults to one of them
still shows under another."""


@contextmanager
def changed(keys: list[str], value: str | None) -> Iterator[str]:
    """Every variable in `keys` set to `value` (None: unset), restored after; yields how each changed."""
    saved = {key: os.environ.get(key) for key in keys}
    for key in keys:
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield "; ".join(f"{key}: {_shown(old)}, then {_shown(value)}" for key, old in saved.items())
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def _shown(value: str | None) -> str:
    return "unset" if value is None else repr(value)


def check_scoring_independent_of_environment(ctx: Context) -> None:
    """Samples score the same when the environment variables the verifier reads (at import or while scoring) are
    set to '0', to '1' and unset in turn, each on a freshly imported verifier."""
    from hubgym.conformance.episodes import fresh_copy

    _repeatable(ctx)
    samples = process_samples(ctx)
    with variables_read() as keys:
        first = fresh_copy(ctx.verifier)
        before = [score_with(first, sample) for sample in samples]
    for value in VARIANTS if keys else ():
        with changed(keys, value) as how:
            again = fresh_copy(ctx.verifier)
            after = [score_with(again, sample) for sample in samples]
        for sample, a, b in zip(samples, before, after):
            if not same_score(a, b):
                fail(f"scoring {sample.label} gave {score_summary(a)}, then {score_summary(b)} once the environment "
                     f"variables the verifier reads were changed ({how}); a reward or step that reads the environment "
                     f"gives another number in every process that scores it",
                     ctx.where(sample.config, sample.split, sample.task.get("id"), "verifier"),
                     "put every setting a reward or step needs into the row's info (from the builder's config); "
                     "never read os.environ in a verifier")


# -- the process's age --------------------------------------------------------------------------------------

def check_scoring_stable_over_many_calls(ctx: Context) -> None:
    """On a freshly imported verifier, one sample scored LONG_RUN_CALLS times (at most LONG_RUN_SECONDS), with the
    golden cases every LONG_RUN_PERIOD calls, scores what it scored at the first call every time."""
    from hubgym.conformance.episodes import fresh_copy

    _repeatable(ctx)
    built = [s for s in ctx.samples if s.config is not None]
    repeated = next((s for s in built if s.label == "a generic reply"), built[0] if built else None)
    golden = [s for s in ctx.samples if s.config is None]
    if repeated is None:
        return
    verifier = fresh_copy(ctx.verifier)
    firsts = {id(s): score_with(verifier, s) for s in [repeated, *golden]}
    deadline = time.perf_counter() + LONG_RUN_SECONDS
    for calls in range(1, LONG_RUN_CALLS + 1):
        batch = [repeated, *golden] if calls % LONG_RUN_PERIOD == 0 else [repeated]
        for sample in batch:
            score = score_with(verifier, sample)
            if not same_score(firsts[id(sample)], score):
                _drifted(ctx, sample, firsts[id(sample)], score, calls)
        if time.perf_counter() > deadline:
            return


def _drifted(ctx: Context, sample: Sample, first: Score, later: Score, calls: int) -> None:
    fail(f"scoring {sample.label} gave {score_summary(first)} on a freshly imported verifier, then "
         f"{score_summary(later)} after {calls:,} calls; most likely the verifier keeps state that changes as it is "
         f"called (a call counter, a table or cache that grows and changes its answers once it is large), so a "
         f"stored reward would depend on how long the process that scored it had run",
         ctx.where(sample.config, sample.split, sample.task.get("id"), "verifier"),
         "keep no module-level state that changes with calls; a cache must give what the function computes "
         "(functools.lru_cache of a pure function does)")


# -- the global random state --------------------------------------------------------------------------------

def check_scoring_leaves_global_random_alone(ctx: Context) -> None:
    """No scoring the checker made (every pass) drew from the process's global random generators."""
    ctx.scored(1)
    ctx.rescored()
    for sample, which in ctx.global_draws:
        fail(f"scoring {sample.label} drew from the process's global {which} generator ({which}'s state moved "
             f"while the verifier ran); its result then depends on whatever else the process drew before, however "
             f"rarely a draw changes it", ctx.where(sample.config, sample.split, sample.task.get("id"), "verifier"),
             _SEEDED_FIX)
