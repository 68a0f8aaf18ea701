"""From rollout rows in real Arrow shards (ShardWriter) to GRPO groups and packed micro-batches."""

from __future__ import annotations

import json
import logging
import pickle
from collections import Counter

import pyarrow as pa
import pytest

from hubgym.errors import BadRowError, NoShardsError, RowContractError, SequenceTooLongError, ShardError
from hubgym.rollout.writer import ShardWriter
from hubgym.train.config import ConfigError
from hubgym.train.groups import GroupSettings, advantages
from hubgym.train.packing import pack_step, take_step
from hubgym.train.local_shards import LocalShards
from hubgym.train.stream import GroupStream

from helpers.stream_rows import row


def shards(tmp_path, name: str, rows: list[dict], per_shard: int = 4):
    """A run folder written by the real ShardWriter: several shards of `per_shard` rows."""
    writer = ShardWriter(tmp_path / name, "w000of001", max_rows=per_shard)
    for start in range(0, len(rows), per_shard):
        writer.add_group(rows[start:start + per_shard])
    writer.flush()
    return tmp_path / name


def forge_shard(folder, rows: list[dict]):
    """A shard of `rows` written with pyarrow alone, as a writer other than hubgym's could (no run manifest)."""
    from hubgym.schemas.tables import rollouts_to_table

    (folder / "shards").mkdir(parents=True)
    table = rollouts_to_table(rows)
    with pa.ipc.new_file(str(folder / "shards" / "w000of001-00000.arrow"), table.schema) as writer:
        writer.write_table(table)
    return folder


def summary(groups) -> list[tuple]:
    return [(g.key, [r["rollout_id"] for r in g.rows], [round(a, 6) for a in g.advantages], g.weight) for g in groups]


# -- advantages and groups ------------------------------------------------------------------------

def test_advantages_by_hand():
    assert advantages([1.0, 0.0, 0.0, 1.0], "dr_grpo") == [0.5, -0.5, -0.5, 0.5]
    # mean 1/3, population std sqrt(((2/3)^2 + 2 (1/3)^2) / 3) = sqrt(2)/3
    assert advantages([1.0, 0.0, 0.0], "grpo") == pytest.approx([(2 / 3) / (2 ** 0.5 / 3), -(1 / 3) / (2 ** 0.5 / 3),
                                                                 -(1 / 3) / (2 ** 0.5 / 3)], rel=1e-5)


def test_groups_assemble_across_interleaved_shard_sources(tmp_path):
    # samples 0-1 of each group in one run folder, samples 2-3 in another: a group completes across sources
    first = shards(tmp_path, "a", [row("arith", g, s, float(s % 2)) for g in range(3) for s in range(2)], per_shard=2)
    second = shards(tmp_path, "b", [row("arith", g, s, float(s == 2)) for g in range(3) for s in range(2, 4)]
                    + [row("rev", g, s, float(s)) for g in range(2) for s in range(4)], per_shard=4)
    stream = GroupStream([LocalShards(first), LocalShards(second)], GroupSettings(n=4))
    groups = list(stream)
    assert sorted(g.key for g in groups) == ["arith-g0", "arith-g1", "arith-g2", "rev-g0", "rev-g1"]
    arith = next(g for g in groups if g.key == "arith-g1")
    assert sorted(r["sample"] for r in arith.rows) == [0, 1, 2, 3]
    rewards = [r["reward"] for r in arith.rows]  # 0, 1, 1, 0 in some order: advantages +-1 (std 0.5)
    assert arith.advantages == pytest.approx([2 * r - 1 for r in rewards], rel=1e-5)
    assert stream.counts["groups"] == 5 and stream.buffered["rows"] == 0


def test_local_shards_reads_training_columns_and_skips_without_decoding(tmp_path):
    rows = [row("e", g, s, 1.0) for g in range(5) for s in range(2)]
    folder = shards(tmp_path, "r", rows, per_shard=4)  # shards of 4, 4, 2 rows
    read = list(LocalShards(folder))
    assert [r["rollout_id"] for r in read] == [r["rollout_id"] for r in rows]
    assert "prompt" not in read[0] and read[0]["provenance"]["policy_version"] == 0
    assert list(LocalShards(folder, columns=None))[3]["info"] == {"k": 1}  # every column, JSON decoded
    for k in (0, 3, 4, 5, 9, 10, 12):
        source = LocalShards(folder)
        assert source.skip(k) == min(k, 10)
        assert [r["rollout_id"] for r in source] == [r["rollout_id"] for r in rows[k:]]
    with pytest.raises(NoShardsError, match="does not exist"):
        LocalShards(tmp_path / "missing")


def test_short_groups_follow_the_policy_and_are_counted():
    rows = [row("e", 0, 0, 1.0), row("e", 0, 1, 0.0), row("e", 1, 0, 1.0), row("e", 1, 1, 0.0), row("e", 1, 2, 0.5),
            row("e", 2, 0, 1.0)]
    dropped = GroupStream([rows], GroupSettings(n=3, short_groups="drop"))
    assert [g.key for g in dropped] == ["e-g1"]
    assert dropped.counts["short_groups"] == 2 and dropped.counts["dropped_groups/short"] == 2
    kept = GroupStream([rows], GroupSettings(n=3, short_groups="keep"))
    assert sorted((g.key, len(g.rows)) for g in kept) == [("e-g0", 2), ("e-g1", 3)]  # one row: no relative signal
    assert kept.counts["dropped_groups/short"] == 1
    with pytest.raises(BadRowError, match="'e-g0' of env 'e' has 2 rows, expected n=3"):
        list(GroupStream([rows], GroupSettings(n=3, short_groups="error")))


def test_zero_variance_groups_dropped_downweighted_or_kept():
    rows = [row("e", 0, s, 1.0) for s in range(2)] + [row("e", 1, s, float(s)) for s in range(2)]
    dropped = GroupStream([rows], GroupSettings(n=2))
    assert [g.key for g in dropped] == ["e-g1"]
    assert dropped.counts["zero_variance_groups"] == 1 and dropped.counts["dropped_groups/zero_variance"] == 1
    down = {g.key: (g.weight, g.advantages) for g in GroupStream([rows], GroupSettings(
        n=2, zero_variance="downweight", zero_variance_weight=0.25))}
    assert down["e-g0"] == (0.25, [0.0, 0.0]) and down["e-g1"][0] == 1.0
    kept = {g.key: g.weight for g in GroupStream([rows], GroupSettings(n=2, zero_variance="keep"))}
    assert kept == {"e-g0": 1.0, "e-g1": 1.0}


REFUSED = {"completion_mask": "one-mask-per-token", "completion_logprobs": "one-logprob-per-token",
           "reward": "reward-or-error"}
"""Rows no writer stores (the row contract): a shard holding one is refused whole where it opens."""


@pytest.mark.parametrize("field, bad", [("completion_mask", {"completion_mask": [1, 1]}),
                                        ("completion_logprobs", {"completion_logprobs": [-1.0]}),
                                        ("tokens_consistent", {"tokens_consistent": False}),
                                        ("reward", {"reward": None}),
                                        ("error", {"error": {"boundary": "engine", "type": "X", "message": "m"},
                                                   "reward": None})])
def test_bad_rows_are_skipped_with_a_named_counted_warning_or_refused_in_strict_mode(tmp_path, field, bad, caplog):
    rows = [{**row("e", 0, 0, 1.0), **bad}, row("e", 0, 1, 0.0), row("e", 0, 2, 1.0)]
    folder = shards(tmp_path, "r", rows if field not in REFUSED else rows[1:])
    if field in REFUSED:
        said = rf"column '{field}', row 0 \(rollout 'e-0-0'\) breaks rule {REFUSED[field]}: "
        with pytest.raises(RowContractError, match=said):
            shards(tmp_path / "bad", "r", rows)  # hubgym's writer never stores it
        assert not list((tmp_path / "bad" / "r" / "shards").glob("*.arrow"))
        with pytest.raises(ShardError, match=said):
            list(LocalShards(forge_shard(tmp_path / "forged", rows)))  # another writer could store it

    def source():  # rows from another source than shards are held to the same rule, row by row
        return rows if field in REFUSED else LocalShards(folder)

    with caplog.at_level(logging.WARNING, logger="hubgym.train"):
        stream = GroupStream([source()], GroupSettings(n=2))
        groups = list(stream)
    assert [sorted(r["sample"] for r in g.rows) for g in groups] == [[1, 2]]
    assert stream.counts[f"skipped_rows/{field}"] == 1
    assert f"env 'e', rollout 'e-0-0', field '{field}'" in caplog.text
    with pytest.raises(BadRowError, match=f"rollout 'e-0-0', field '{field}'") as info:
        list(GroupStream([source()], GroupSettings(n=2, strict=True)))
    assert (info.value.env, info.value.rollout_id, info.value.field) == ("e", "e-0-0", field)
    assert pickle.loads(pickle.dumps(info.value)).field == field  # crosses process boundaries intact


def test_warnings_stop_after_a_few_but_counting_goes_on(caplog):
    rows = [row("e", g, 0, None) for g in range(10)]
    with caplog.at_level(logging.WARNING, logger="hubgym.train"):
        stream = GroupStream([rows], GroupSettings(n=2))
        assert list(stream) == []
    assert stream.counts["skipped_rows/reward"] == 10 and caplog.text.count("skipped a rollout row") == 3


def test_unknown_env_is_skipped_or_refused():
    rows = [row("other", 0, s, float(s)) for s in range(2)] + [row("e", 1, s, float(s)) for s in range(2)]
    stream = GroupStream([rows], GroupSettings(n=2), env_weights={"e": 1.0})
    assert [g.env for g in stream] == ["e"] and stream.counts["skipped_rows/env"] == 2
    for settings in (GroupSettings(n=2, unknown_env="error"), GroupSettings(n=2, strict=True)):
        with pytest.raises(BadRowError, match="env 'other' is not in the training config's envs \\(e\\)"):
            list(GroupStream([rows], settings, env_weights={"e": 1.0}))


def test_duplicate_samples_are_skipped():
    rows = [row("e", 0, 0, 1.0), row("e", 0, 0, 1.0), row("e", 0, 1, 0.0)]
    stream = GroupStream([rows], GroupSettings(n=2))
    [group] = list(stream)
    assert [r["sample"] for r in group.rows] == [0, 1] and stream.counts["skipped_rows/sample"] == 1


def test_rows_without_an_env_still_form_groups_and_an_empty_env_name_is_skipped():
    rows = [{**row("e", g, s, float(s)), "env": env} for g, env in enumerate([None, ""]) for s in range(2)]
    stream = GroupStream([rows], GroupSettings(n=2))
    assert [(g.env, g.key) for g in stream] == [("?", "e-g0")] and stream.counts["groups"] == 1
    assert stream.counts["skipped_rows/env"] == 2  # '' is no env name (the row contract's env-name rule)


def test_every_row_read_is_handed_to_on_row_trainable_or_not():
    rows = [row("e", 0, s, 1.0) for s in range(2)] + [row("e", 1, s, float(s)) for s in range(2)]
    rows.append(row("e", 2, 0, None))  # unscored: skipped
    seen: list[str] = []
    stream = GroupStream([rows], GroupSettings(n=2), on_row=lambda r: seen.append(r["rollout_id"]))
    assert [g.key for g in stream] == ["e-g1"]  # group 0 is zero-variance (dropped), row e-2-0 unscored
    assert seen == [r["rollout_id"] for r in rows]


def test_settings_are_validated_with_the_fix():
    with pytest.raises(ConfigError, match="grpo.short_groups is 'sometimes'; use one of drop, keep, error"):
        GroupSettings(short_groups="sometimes")
    with pytest.raises(ConfigError, match="weights must be > 0"):
        GroupStream([[]], GroupSettings(), env_weights={"e": 0.0})


# -- mixture, memory, resume ----------------------------------------------------------------------

def test_mixture_weights_set_the_share_of_each_env():
    a = [row("a", g, s, float(s)) for g in range(400) for s in range(2)]
    b = [row("b", g, s, float(s)) for g in range(400) for s in range(2)]
    stream = GroupStream([iter(a), iter(b)], GroupSettings(n=2), env_weights={"a": 3.0, "b": 1.0}, seed=1)
    first = Counter(stream.next_group().env for _ in range(200))
    assert 0.65 < first["a"] / 200 < 0.85  # 3:1 -> 75% (binomial sd ~3%)
    # the same shares whatever the order of the rows: one source holding all of b first, then all of a
    stream = GroupStream([iter(b + a)], GroupSettings(n=2, buffer_groups=512), env_weights={"a": 3.0, "b": 1.0},
                         seed=1)
    first = Counter(stream.next_group().env for _ in range(200))
    assert 0.65 < first["a"] / 200 < 0.85


def test_buffer_of_incomplete_groups_is_bounded_and_sources_are_not_read_ahead():
    # every group's two samples are 50 rows apart: the buffer closes the oldest as short instead of growing
    rows = [row("e", g, 0, 1.0) for g in range(50)] + [row("e", g, 1, 0.0) for g in range(50)]
    stream = GroupStream([rows], GroupSettings(n=2, buffer_groups=10))
    assert list(stream) == [] and stream.peak_pending == 10
    assert stream.counts["short_groups"] == 100  # each half of every group was pushed out alone
    roomy = GroupStream([rows], GroupSettings(n=2, buffer_groups=50))
    assert len(list(roomy)) == 50 and roomy.peak_pending == 50 and roomy.counts["short_groups"] == 0

    pulled = []

    def source():
        for r in (row("e", g, s, float(s)) for g in range(1000) for s in range(2)):
            pulled.append(r)
            yield r

    stream = GroupStream([source()], GroupSettings(n=2, buffer_groups=8))
    assert stream.next_group().key == "e-g0" and len(pulled) == 2  # the first group, not the whole source


def make_sources(tmp_path, kind: str):
    """Three sources, two envs; groups split across sources so that incomplete groups are buffered."""
    a = [row("arith", g, s, float((g + s) % 3 == 0)) for g in range(12) for s in range(2)]
    b = [row("arith", g, s, float(s == 3 and g % 2 == 0)) for g in reversed(range(12)) for s in range(2, 4)]
    c = [row("rev", g, s, float((g * s) % 2), truncated=(s == 1)) for g in range(10) for s in range(4)]
    if kind == "lists":
        return lambda: [iter(a), iter(b), iter(c)]
    folders = [shards(tmp_path, name, rows, per_shard=6) for name, rows in (("a", a), ("b", b), ("c", c))]
    return lambda: [LocalShards(f) for f in folders]


@pytest.mark.parametrize("kind", ["shards", "lists"])
def test_resume_from_state_gives_identical_subsequent_groups(tmp_path, kind):
    sources = make_sources(tmp_path, kind)
    settings = GroupSettings(n=4, zero_variance="downweight", truncated="zero")
    weights = {"arith": 2.0, "rev": 1.0}
    whole = summary(GroupStream(sources(), settings, weights, seed=3))
    assert len(whole) >= 10

    stream = GroupStream(sources(), settings, weights, seed=3)
    head = [stream.next_group() for _ in range(4)]
    state = json.loads(json.dumps(stream.state()))  # what a checkpoint stores
    assert state["pending"] and state["ready"]  # the resume has buffered rows to bring back
    tail = list(stream)
    assert summary(head) + summary(tail) == whole

    resumed = GroupStream(sources(), settings, weights, seed=3)
    resumed.restore(state)
    assert summary(list(resumed)) == summary(tail)
    assert resumed.counts == stream.counts and resumed.positions == stream.positions


def test_restore_refuses_other_sources_or_settings(tmp_path):
    sources = make_sources(tmp_path, "lists")
    stream = GroupStream(sources(), GroupSettings(n=4), seed=0)
    stream.next_group()
    state = stream.state()
    with pytest.raises(ValueError, match="restore with the same sources"):
        GroupStream(sources()[:2], GroupSettings(n=4)).restore(state)
    with pytest.raises(ValueError, match="other group settings \\(zero_variance\\)"):
        GroupStream(sources(), GroupSettings(n=4, zero_variance="keep")).restore(state)
    with pytest.raises(ValueError, match="the sources changed"):
        GroupStream([iter([]), iter([]), iter([])], GroupSettings(n=4)).restore(state)


# -- truncation, packing ------------------------------------------------------------------------

def test_truncated_rows_masked_zeroed_or_kept():
    rows = [row("e", 0, 0, 1.0, truncated=True), row("e", 0, 1, 0.0)]
    masked = next(iter(GroupStream([rows], GroupSettings(n=2, truncated="mask"))))
    assert masked.loss_masked == [True, False] and masked.advantages == pytest.approx([1.0, -1.0], rel=1e-5)
    [mb] = pack_step([masked], max_tokens=1000)[0]
    at, cols = mb.span(mb.rollout_ids.index("e-0-0"))
    assert mb.loss_mask[at, cols].sum() == 0
    assert mb.num_sequences == 1 and mb.num_tokens == 4  # the masked row does not count
    zeroed = next(iter(GroupStream([rows], GroupSettings(n=2, truncated="zero"))))
    assert zeroed.advantages[0] == 0.0 and zeroed.loss_masked == [False, False]
    kept = next(iter(GroupStream([rows], GroupSettings(n=2))))
    assert kept.advantages[0] == pytest.approx(1.0, rel=1e-5) and kept.loss_masked == [False, False]


def test_packing_respects_the_token_budget_and_splits_across_ranks():
    rows = [row("e", g, s, float(s), n_completion=3 + g) for g in range(6) for s in range(2)]
    groups = list(GroupStream([rows], GroupSettings(n=2)))
    [single] = pack_step(groups, max_tokens=40)
    assert len(single) > 1 and all(mb.input_ids.numel() <= 40 for mb in single)  # padding included
    assert sorted(i for mb in single for i in mb.rollout_ids) == sorted(r["rollout_id"] for r in rows)
    assert {mb.num_sequences for mb in single} == {12}
    assert {mb.num_tokens for mb in single} == {sum(3 + g for g in range(6)) * 2}
    widths = [mb.input_ids.shape[1] for mb in single]
    assert widths == sorted(widths, reverse=True)  # longest first: each micro-batch as wide as its longest row

    two = pack_step(groups, max_tokens=40, world_size=2)
    assert len(two[0]) == len(two[1]) == -(-len(single) // 2)  # the same, least number of passes on every rank
    assert sorted(i for share in two for mb in share for i in mb.rollout_ids) == sorted(r["rollout_id"] for r in rows)
    again = pack_step(groups, max_tokens=40, world_size=2)
    assert [[mb.rollout_ids for mb in share] for share in two] == [[mb.rollout_ids for mb in share] for share in again]
    loads = [sum(mb.input_ids.numel() for mb in share if mb.rollout_ids) for share in two]
    assert abs(loads[0] - loads[1]) <= max(mb.input_ids.numel() for mb in single)  # balanced to one micro-batch

    first = single[0]
    at, cols = first.span(0)
    p, c = 3, cols.stop - cols.start - 3
    mask = first.loss_mask[at, cols]
    assert mask[:p].sum() == 0 and mask[p:p + c].sum() == c  # prompt masked

    four = pack_step(groups[:1], max_tokens=1000, world_size=4)  # fewer micro-batches than ranks
    assert [len(share) for share in four] == [1, 1, 1, 1]
    assert sum(mb.loss_mask.sum().item() for share in four for mb in share) == 2 * 3


def test_a_sequence_longer_than_the_budget_is_refused_with_the_fix():
    groups = list(GroupStream([[row("e", 0, 0, 1.0, n_completion=50), row("e", 0, 1, 0.0)]], GroupSettings(n=2)))
    with pytest.raises(SequenceTooLongError, match="rollout 'e-0-0' of env 'e' has 53 tokens.*micro_batch_tokens=40"):
        pack_step(groups, max_tokens=40)


def test_env_tokens_keep_mask_zero_after_packing():
    r0 = row("e", 0, 0, 1.0, completion_mask=[1, 0, 0, 1], completion_logprobs=[-1.0, 0.0, 0.0, -2.0])
    groups = list(GroupStream([[r0, row("e", 0, 1, 0.0)]], GroupSettings(n=2)))
    mb = next(mb for mb in pack_step(groups, 1000)[0] if "e-0-0" in mb.rollout_ids)
    at, cols = mb.span(mb.rollout_ids.index("e-0-0"))
    assert mb.loss_mask[at, cols][3:7].tolist() == [1, 0, 0, 1]
    assert mb.old_logprobs[at, cols][3:7].tolist() == [-1.0, 0.0, 0.0, -2.0]
    assert mb.num_tokens == 2 + 4


def test_take_step_by_groups_or_by_sequences():
    rows = [row("e", g, s, float(s)) for g in range(5) for s in range(2)]
    stream = GroupStream([rows], GroupSettings(n=2))
    assert [g.key for g in take_step(stream, groups=2)] == ["e-g0", "e-g1"]
    assert [g.key for g in take_step(stream, sequences=3)] == ["e-g2", "e-g3"]  # whole groups, >= 3 rows
    assert [g.key for g in take_step(stream, groups=4)] == ["e-g4"]  # the stream ended
    assert take_step(stream, groups=1) == []
