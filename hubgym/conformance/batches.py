"""check_batch_rows_independent: a verifier's batch rewards give each row what it gets alone, whatever the batch.

The rollout loop scores a group's samples as one batch (one task object, n completions) and a re-score
scores record batches of up to 512 rows, in the order the shards hold them. A batch reward that reads
other rows of its batch (a mean, a maximum, a rank, a count, a cache keyed by position) would store
rewards that depend on the batch, and no re-score would reproduce them. The scoring checks' samples are
scored alone, then in batches laid out four ways (LAYOUTS); every row must score the same in each.
"""

from __future__ import annotations

import copy
import random
from typing import TYPE_CHECKING

from hubgym.conformance.common import CheckSkipped, Sample, fail, same_score, score_summary
from hubgym.conformance.purity import purity_guard
from hubgym.schemas import Message
from hubgym.verifiers.contract import Score

if TYPE_CHECKING:
    from hubgym.conformance.context import Context

LAYOUTS = ("all {n} rows in order", "all {n} rows shuffled", "the rows of each task together, as a rollout group",
           "batches of 3, in reverse order")
_FIX = ("compute each row's value from its own task and completion only (vectorizing over the rows is fine; "
        "normalizing, ranking or caching across them is not)")


def check_batch_rows_independent(ctx: Context) -> None:
    """Scored in batches of other sizes and orders, every sampled row scores what it scores alone (verifiers with
    BATCH_REWARDS only)."""
    verifier = ctx.verifier
    if not verifier.batch_rewards:
        return
    rows = _rows(ctx)
    alone = _scored(ctx, rows, [[i] for i in range(len(rows))])
    for layout in LAYOUTS:
        batches = _batches(layout, rows)
        for i, score in sorted(_scored(ctx, rows, batches).items()):
            if same_score(alone[i], score):
                continue
            sample, size = rows[i][0], len(next(b for b in batches if i in b))
            if not same_score(alone[i], _scored(ctx, rows, [[i]])[i]):  # not even alone twice: chance, not the batch
                raise CheckSkipped.because("scores that repeat", "check_scoring_deterministic",
                                           ctx.where(sample.config, sample.split, sample.task["id"]), ctx.check)
            name = next((n for n in verifier.batch_rewards
                         if alone[i].components.get(n) != score.components.get(n)), "BATCH_REWARDS")
            fail(f"scoring {sample.label} in a batch of {size} rows ({layout.format(n=len(rows))}) gave "
                 f"{score_summary(score)}, but alone it gave {score_summary(alone[i])}; most likely batch reward "
                 f"{name!r} computes a row's value from other rows of its batch (a mean, a maximum, a rank, a count, "
                 f"a cache by position): the rollout loop scores a group's samples as one batch and a re-score scores "
                 f"batches of other sizes and orders, so stored rewards would depend on the batch and a re-score "
                 f"would not reproduce them", ctx.where(sample.config, sample.split, sample.task["id"], name), _FIX)


def _rows(ctx: Context) -> list[tuple[Sample, list[Message]]]:
    """Each sample with the completion it is scored on (a golden episode played from its actions; one that cannot
    be played is check_golden_replay's failure and is left out here)."""
    rows = []
    for sample in ctx.samples:
        completion = sample.completion or []
        if sample.actions is not None:
            try:
                completion = ctx.verifier.run_episode(sample.task, sample.actions).completion()
            except Exception:  # reported by check_golden_cases / check_golden_replay
                continue
        rows.append((sample, completion))
    return rows


def _batches(layout: str, rows: list[tuple[Sample, list[Message]]]) -> list[list[int]]:
    """The row indices of each batch of `layout` (one of LAYOUTS)."""
    order = list(range(len(rows)))
    if layout == LAYOUTS[0]:
        return [order]
    if layout == LAYOUTS[1]:
        return [random.Random(len(order)).sample(order, len(order))]
    if layout == LAYOUTS[2]:
        groups: dict[int, list[int]] = {}
        for i, (sample, _) in enumerate(rows):
            groups.setdefault(id(sample.task), []).append(i)  # the samples of a built row share its task object
        return list(groups.values())
    backwards = order[::-1]
    return [backwards[start:start + 3] for start in range(0, len(backwards), 3)]


def _scored(ctx: Context, rows: list[tuple[Sample, list[Message]]], batches: list[list[int]]) -> dict[int, Score]:
    """{row index: Score} with each batch scored by one `score_batch` call, on fresh copies of its tasks and
    completions (copied together, so the rows of one task still share one task object), side effects refused."""
    scores: dict[int, Score] = {}
    for batch in batches:
        tasks, completions = copy.deepcopy(([rows[i][0].task for i in batch], [rows[i][1] for i in batch]))
        with purity_guard():  # a refused side effect is check_verifier_pure's failure; here it is a row error
            scores.update(zip(batch, ctx.verifier.score_batch(tasks, completions)))
    return scores
