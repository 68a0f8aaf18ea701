"""From rollout rows (real Arrow shards) to GRPO groups and packed micro-batches."""

from __future__ import annotations

import datetime as dt
import logging
from collections import Counter

import pytest

from hubgym.hub.rollouts import iter_rollout_rows
from hubgym.rollout.writer import ShardWriter
from hubgym.train.groups import BadRowError, GroupSettings, GroupStream, advantages
from hubgym.train.packing import pack_step


def row(env: str, group: int, sample: int, reward: float, *, n_prompt=3, n_completion=4, **overrides) -> dict:
    base = {
        "rollout_id": f"{env}-{group}-{sample}", "run_id": "r", "task_id": f"t{group}", "env": env,
        "group": f"{env}-g{group}", "sample": sample, "prompt": [], "completion": [], "info": {},
        "interaction": {"kind": "single_turn", "max_turns": 1, "tools": [], "tool_rewards": [], "max_tokens": None},
        "prompt_ids": list(range(1, n_prompt + 1)), "completion_ids": [7] * n_completion,
        "completion_mask": [1] * n_completion, "completion_logprobs": [-1.0] * n_completion,
        "tokens_consistent": True, "reward": reward, "metrics": [], "finish_reason": "stop", "truncated": False,
        "num_turns": 1, "error": None,
        "provenance": {"model": "m", "policy_version": 0, "sampling": "{}", "env_repo": None, "env_revision": None,
                       "verifier_module": "v", "verifier_sha256": "0", "engine": "vllm", "engine_version": "0",
                       "chat_template_sha256": None},
        "timings": {"generate_s": 0.0, "tools_s": 0.0, "score_s": 0.0, "total_s": 0.0},
        "created_at": dt.datetime.now(dt.timezone.utc),
    }
    return {**base, **overrides}


def shards(tmp_path, name: str, rows: list[dict], per_shard: int = 4):
    writer = ShardWriter(tmp_path / name, "w000of001", max_rows=per_shard)
    for start in range(0, len(rows), per_shard):
        writer.add_group(rows[start:start + per_shard])
    writer.flush()
    return tmp_path / name


def test_advantages_by_hand():
    assert advantages([1.0, 0.0], "dr_grpo") == [0.5, -0.5]
    assert advantages([1.0, 0.0], "grpo") == pytest.approx([1.0, -1.0], rel=1e-5)  # population std 0.5


def test_groups_assemble_across_interleaved_shard_sources(tmp_path):
    a = shards(tmp_path, "a", [row("arith", g, s, float(s)) for g in range(3) for s in range(2)])
    b = shards(tmp_path, "b", [row("rev", g, s, float(s == 0)) for g in range(2) for s in range(2)])
    stream = GroupStream([iter_rollout_rows([a]), iter_rollout_rows([b])], GroupSettings(n=2))
    groups = list(stream)
    assert sorted(g.key for g in groups) == ["arith-g0", "arith-g1", "arith-g2", "rev-g0", "rev-g1"]
    assert all(len(g.rows) == 2 and sorted(g.advantages) == pytest.approx([-1.0, 1.0], rel=1e-5) for g in groups)
    assert stream.counts["groups"] == 5


def test_short_groups_follow_the_policy():
    rows = [row("e", 0, 0, 1.0), row("e", 0, 1, 0.0), row("e", 1, 0, 1.0), row("e", 1, 1, 0.0), row("e", 1, 2, 0.5)]
    dropped = GroupStream([rows], GroupSettings(n=3, short_groups="drop"))
    assert [g.key for g in dropped] == ["e-g1"] and dropped.counts["dropped_groups/short"] == 1
    kept = GroupStream([rows], GroupSettings(n=3, short_groups="keep"))
    assert sorted(len(g.rows) for g in kept) == [2, 3]
    with pytest.raises(BadRowError, match="e-g0.*2 rows, expected n=3"):
        list(GroupStream([rows], GroupSettings(n=3, short_groups="error")))


def test_zero_variance_groups_dropped_or_downweighted():
    rows = [row("e", 0, s, 1.0) for s in range(2)] + [row("e", 1, s, float(s)) for s in range(2)]
    assert [g.key for g in GroupStream([rows], GroupSettings(n=2))] == ["e-g1"]
    weights = {g.key: g.weight for g in GroupStream([rows], GroupSettings(n=2, zero_variance="downweight",
                                                                           zero_variance_weight=0.25))}
    assert weights == {"e-g0": 0.25, "e-g1": 1.0}


@pytest.mark.parametrize("field, bad", [("completion_mask", [1, 1]), ("completion_logprobs", [-1.0]),
                                        ("tokens_consistent", False), ("reward", None),
                                        ("error", {"boundary": "engine", "type": "X", "message": "m"})])
def test_bad_rows_are_skipped_with_a_named_warning_or_refused_in_strict_mode(field, bad, caplog):
    rows = [{**row("e", 0, 0, 1.0), field: bad}, row("e", 0, 1, 0.0), row("e", 0, 2, 1.0)]
    with caplog.at_level(logging.WARNING, logger="hubgym.train"):
        stream = GroupStream([rows], GroupSettings(n=2))
        assert [len(g.rows) for g in stream] == [2]
    assert stream.counts[f"skipped_rows/{field}"] == 1
    assert "e-0-0" in caplog.text and field in caplog.text
    with pytest.raises(BadRowError, match=f"rollout 'e-0-0', field '{field}'"):
        list(GroupStream([rows], GroupSettings(n=2, strict=True)))


def test_unknown_env_is_skipped_or_refused():
    rows = [row("other", 0, s, float(s)) for s in range(2)] + [row("e", 1, s, float(s)) for s in range(2)]
    stream = GroupStream([rows], GroupSettings(n=2), env_weights={"e": 1.0})
    assert [g.env for g in stream] == ["e"] and stream.counts["skipped_rows/env"] == 2
    with pytest.raises(BadRowError, match="env 'other' is not in the training config"):
        list(GroupStream([rows], GroupSettings(n=2, strict=True), env_weights={"e": 1.0}))


def test_mixture_weights_set_the_share_of_each_env():
    a = [row("a", g, s, float(s)) for g in range(400) for s in range(2)]
    b = [row("b", g, s, float(s)) for g in range(400) for s in range(2)]
    stream = GroupStream([iter(a), iter(b)], GroupSettings(n=2), env_weights={"a": 3.0, "b": 1.0}, seed=1)
    first = Counter(stream.next_group().env for _ in range(200))
    assert 0.65 < first["a"] / 200 < 0.85  # 3:1 -> 75% (binomial sd ~3%)


def test_buffer_of_incomplete_groups_is_bounded():
    # groups arrive with their samples far apart: the buffer closes the oldest as short instead of growing
    rows = [row("e", g, 0, 1.0) for g in range(50)] + [row("e", g, 1, 0.0) for g in range(50)]
    stream = GroupStream([rows], GroupSettings(n=2, buffer_groups=10))
    sizes = []
    for _ in stream:
        sizes.append(len(stream._pending))
    assert max(sizes, default=0) <= 10 and stream.counts["short_groups"] >= 40


def test_truncated_rows_masked_or_zeroed():
    rows = [row("e", 0, 0, 1.0, truncated=True), row("e", 0, 1, 0.0)]
    masked = next(iter(GroupStream([rows], GroupSettings(n=2, truncated="mask"))))
    assert masked.loss_masked == [True, False]
    [mb] = pack_step([masked], max_tokens=1000)[0]
    assert mb.loss_mask[mb.rollout_ids.index("e-0-0")].sum() == 0
    zeroed = next(iter(GroupStream([rows], GroupSettings(n=2, truncated="zero"))))
    assert zeroed.advantages[0] == 0.0


def test_packing_respects_the_token_budget_and_splits_across_ranks():
    rows = [row("e", g, s, float(s), n_completion=3 + g) for g in range(6) for s in range(2)]
    groups = list(GroupStream([rows], GroupSettings(n=2)))
    [single] = pack_step(groups, max_tokens=40)
    assert all(mb.input_ids.numel() <= 40 for mb in single)
    assert sum(mb.input_ids.shape[0] for mb in single) == 12
    assert {mb.num_sequences for mb in single} == {12}
    assert {mb.num_tokens for mb in single} == {sum(3 + g for g in range(6)) * 2}
    two = pack_step(groups, max_tokens=40, world_size=2)
    assert len(two[0]) == len(two[1])  # same number of backward passes on every rank
    ids = sorted(i for share in two for mb in share for i in mb.rollout_ids)
    assert ids == sorted(r["rollout_id"] for r in rows)
    first = single[0]
    p, c = 3, len(rows[0]["completion_ids"])
    assert first.loss_mask[0, :p].sum() == 0 and first.loss_mask[0, p:p + c].sum() == c  # prompt masked, completion not


def test_env_tokens_keep_mask_zero_after_packing():
    r0 = row("e", 0, 0, 1.0, completion_mask=[1, 0, 0, 1], completion_logprobs=[-1.0, 0.0, 0.0, -2.0])
    groups = list(GroupStream([[r0, row("e", 0, 1, 0.0)]], GroupSettings(n=2)))
    mb = next(mb for mb in pack_step(groups, 1000)[0] if "e-0-0" in mb.rollout_ids)
    i = mb.rollout_ids.index("e-0-0")
    assert mb.loss_mask[i, 3:7].tolist() == [1, 0, 0, 1]
    assert mb.old_logprobs[i, 3:7].tolist() == [-1.0, 0.0, 0.0, -2.0]
