"""The task mixture: a seeded, resumable stream over many env configs with flat memory.

Fake families are real TaskBuilder subclasses made with a class factory (rows from `generate_tasks`, the
arithmetic verifier); the built-in arithmetic env checks size and seed overrides on a real generator.
"""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import pytest

from hubgym.builders.base import TaskBuilder, TaskConfig
from hubgym.builders.families import FamilyEnv
from hubgym.errors import EnvContractError, EnvNotFoundError
from hubgym.mixture import KeepAll, Mixture, TaskFilter, expand, load_mix_spec, parse_spec
from hubgym.envs.listing import Listing, listing
from hubgym.schemas import make_task, user

_BUILDERS: dict[tuple[str, int], type[TaskBuilder]] = {}


def fake_builder(name: str, rows: int = 40) -> type[TaskBuilder]:
    """A procedural env of `rows` train tasks per config (cached: one class per name, as families do)."""
    if (name, rows) not in _BUILDERS:
        def generate_tasks(self, split, size, seed):
            for i in range(size):
                yield make_task(self.ENV, [user(f"{self.ENV} {self.config.name} {seed} task {i}")], {"answer": str(i)})

        _BUILDERS[name, rows] = type(f"Fake_{name}_{rows}", (TaskBuilder,), {
            "ENV": name, "VERIFIER": "hubgym.verifiers.arithmetic", "GOLDEN": "unused.jsonl",
            "BUILDER_CONFIGS": [TaskConfig(name=c, sizes={"train": rows}) for c in ("a", "b")],
            "generate_tasks": generate_tasks, "__module__": __name__})
    return _BUILDERS[name, rows]


def fake_listing(count: int, rows: int = 40) -> Listing:
    """`count` envs of family "fake": even ones tagged math, every third one also tagged games."""
    entries = [FamilyEnv(f"fake_{i}", "single_turn", ("a", "b"),
                         ("math",) * (i % 2 == 0) + ("games",) * (i % 3 == 0), "fake", "a fake env")
               for i in range(count)]
    return Listing(entries, {e.name: (lambda n=e.name: fake_builder(n, rows)) for e in entries})


def ids(batch) -> list[str]:
    return [d.task["id"] for d in batch]


def mixture(spec, lst, seed=0, **options) -> Mixture:
    return Mixture.from_spec(parse_spec(spec), split="train", seed=seed, listing=lst, **options)


def test_a_seed_fixes_the_stream_and_another_seed_changes_it():
    lst = fake_listing(20)
    spec = [{"source": "fake", "configs": "all"}]
    first = [ids(mixture(spec, lst).take(32)) for _ in range(2)]
    assert first[0] == first[1] and len(first[0]) == 32
    assert ids(mixture(spec, lst, seed=1).take(32)) != first[0]


@pytest.mark.slow
@pytest.mark.parametrize("max_open", [64, 2])  # 2: sources are evicted and reopened at their positions
def test_a_resumed_stream_draws_what_the_uninterrupted_one_draws(max_open):
    lst = fake_listing(6, rows=30)  # small envs: epochs wrap within the run
    spec = {"envs": [{"source": "fake", "configs": "all"}], "tag_weights": {"games": 3.0}}
    whole = mixture(spec, lst, max_open=max_open)
    uninterrupted = [ids(whole.take(16)) for _ in range(12)]
    killed = mixture(spec, lst, max_open=max_open)
    before = [ids(killed.take(16)) for _ in range(5)]
    saved = json.loads(json.dumps(killed.state()))  # as a manifest stores it
    resumed = mixture(spec, lst, max_open=max_open).restore(saved)
    assert before + [ids(resumed.take(16)) for _ in range(7)] == uninterrupted
    assert any(epoch > 0 for epoch, _ in saved["positions"].values()) or any(
        epoch > 0 for epoch, _ in whole.state()["positions"].values())  # the run crossed an epoch


def test_no_task_twice_in_a_batch_and_a_small_env_gives_what_it_has():
    lst = fake_listing(1, rows=5)
    batch = mixture([{"name": "fake_0:a"}], lst).take(12)
    assert sorted(ids(batch)) == sorted(set(ids(batch))) and len(batch) == 5


def test_entry_weights_sum_and_tag_weights_multiply():
    lst = fake_listing(6)  # math: 0, 2, 4; games: 0, 3
    spec = parse_spec({"envs": [{"tag": "math", "weight": 2}, {"name": "fake_0:a", "weight": 1},
                                {"name": "fake_1"}], "tag_weights": {"games": 3.0}})
    weights = {e.key: e.weight for e in expand(spec, lst)}
    assert weights == {"fake_0:a": (2 + 1) * 3.0, "fake_2:a": 2.0, "fake_4:a": 2.0, "fake_1:a": 1.0}
    both = mixture({"envs": [{"name": "fake_0:a"}, {"name": "fake_0:b", "weight": 2}, {"name": "fake_1"}]}, lst)
    assert both.weights_by_env() == {"fake_0": 3.0, "fake_1": 1.0}  # configs of one env add up under its name


def test_draws_follow_the_weights_by_env_and_by_tag():
    lst = fake_listing(6, rows=500)
    spec = {"envs": [{"name": "fake_1", "weight": 1}, {"name": "fake_5", "weight": 3}, {"tag": "games"}],
            "tag_weights": {"games": 2.0}}  # fake_0 and fake_3 (games, 1 x 2 each): 1 : 3 : 2 : 2
    mix = mixture(spec, lst, seed=7)
    counts = collections.Counter(d.task["env"] for _ in range(80) for d in mix.take(50))  # 4000 draws: epochs wrap
    expected = {"fake_1": 1 / 8, "fake_5": 3 / 8, "fake_0": 2 / 8, "fake_3": 2 / 8}
    total = sum(counts.values())
    for env, share in expected.items():
        assert abs(counts[env] / total - share) < 0.03, (env, counts)


@pytest.mark.slow
def test_open_sources_stay_under_the_lru_bound_over_1000_envs():
    lst = fake_listing(1000, rows=20)
    mix = mixture([{"source": "fake", "configs": "all"}], lst, max_open=16)
    for _ in range(40):
        mix.take(50)
        assert mix.open_sources() <= 16
    assert mix.pool.most_open == 16 and mix.pool.opens > 1000  # many envs opened, never more than 16 at once
    assert len(mix.state()["positions"]) > 1000  # the state: a position per env config drawn, no rows


class RejectAll:
    def keep(self, env: str, task_id: str) -> bool:
        return False

    def update(self, rows: list[dict]) -> None:
        raise AssertionError("not called by the mixture")


class RejectListed:
    """Keeps every task but the listed ids; records what it was asked."""

    def __init__(self, rejected: set[str]):
        self.rejected, self.asked = rejected, []

    def keep(self, env: str, task_id: str) -> bool:
        self.asked.append(env)
        return task_id not in self.rejected

    def update(self, rows: list[dict]) -> None:
        self.rejected -= {r["task_id"] for r in rows}


def test_a_filter_that_rejects_everything_stops_with_a_clear_error():
    assert isinstance(RejectAll(), TaskFilter) and isinstance(KeepAll(), TaskFilter)
    mix = mixture([{"name": "fake_0:a"}], fake_listing(1), task_filter=RejectAll(), max_rejections=50)
    with pytest.raises(EnvContractError, match=r"^the task filter RejectAll rejected 50 tasks of env config "
                                               r"'fake_0:a' in a row, so no task of it can be drawn \[env='fake_0' "
                                               r"config='a' split='train' row='fake_0-[0-9a-f]+' field='task_filter'\]"
                                               r"\. Fix: widen the filter"):
        mix.take(1)


def test_a_filter_skips_the_tasks_it_does_not_keep():
    lst = fake_listing(3, rows=30)
    spec = [{"source": "fake"}]
    everything = ids(mixture(spec, lst).take(40))
    rejected = set(everything[::2])
    band = RejectListed(set(rejected))
    kept = ids(mixture(spec, lst, task_filter=band).take(40))
    assert not rejected & set(kept) and set(band.asked) <= {"fake_0", "fake_1", "fake_2"}


@pytest.mark.parametrize("spec, error, said", [
    ([{"name": "no_such_env"}], EnvNotFoundError, "no environment named 'no_such_env'"),
    ([{"tag": "maths"}], EnvNotFoundError, "the mixture names tag 'maths', which no listed env has [field='tag']; "
                                           "did you mean math?"),
    ([{"source": "fakes"}], EnvNotFoundError, "the mixture names source 'fakes'"),
    ({"envs": [{"source": "fake"}], "tag_weights": {"gamez": 2}}, EnvNotFoundError, "tag 'gamez'"),
    ([{"name": "fake_0:c"}], EnvContractError, "env 'fake_0' has no config 'c' [env='fake_0' config='c']. Fix: write "
                                               "ENV:CONFIG with one of its configs: a, b"),
    ([{"name": "fake_0", "tag": "math"}], EnvContractError, "selects by exactly one of name, source or tag"),
])
def test_an_unknown_name_tag_source_or_config_is_one_error_naming_it(spec, error, said):
    with pytest.raises(error) as raised:
        mixture(spec, fake_listing(4))
    assert said in str(raised.value)


def test_a_spec_file_and_the_builtin_catalog(tmp_path):
    path = tmp_path / "mix.yaml"
    path.write_text("envs:\n  - arithmetic:easy\n  - {name: 'arithmetic:*', weight: 0.5}\n"
                    "  - {name: arithmetic:hard, seed: 3, size: 2000}\n")
    mix = Mixture.from_spec(load_mix_spec(path), split="train", seed=0, listing=listing())
    assert {e.key: e.weight for e in mix.envs}["arithmetic:easy"] == 1.5
    assert "arithmetic:hard?seed=3&size=2000" in {e.key for e in mix.envs}
    batch = mix.take(64)
    assert len(batch) == 64 and mix.opened(batch[0].env).verifier.name
    assert all(d.task["env"] == "arithmetic" and d.task["split"] == "train" for d in batch)


def test_a_seed_override_is_another_env_config_of_the_same_generator():
    lst = listing()
    rows = {}
    for seed in (3, 4):
        mix = Mixture.from_spec(parse_spec([{"name": "arithmetic:hard", "seed": seed, "size": 100_000}]),
                                split="train", seed=0, listing=lst)
        rows[seed] = ids(mix.take(20))
    assert not set(rows[3]) & set(rows[4])


def test_the_online_producer_resumes_its_draw_from_the_stored_manifest(tmp_path):
    from hubgym.engines import SamplingArgs
    from hubgym.train.online import OnlineProducer

    lst = fake_listing(30, rows=20)

    def producer(out, task_filter=None):
        return OnlineProducer([{"source": "fake", "configs": "all"}], split="train", model="m", out_dir=out, n=2,
                              sampling=SamplingArgs(), max_model_len=256, listing=lst, max_open=4,
                              task_filter=task_filter)

    def keys(picks):
        return [(str(e.ref), t["id"]) for e, t in picks]

    whole = producer(tmp_path / "a")
    steps = []
    for step in range(4):
        steps.append(keys(whole.pick(step, 8)))
        if step == 1:
            assert keys(whole.pick(1, 8)) == steps[1]  # a cancelled step draws the same tasks again
        whole._commit(*whole._after)  # what a written step does
    out = tmp_path / "b"
    out.mkdir()
    killed = producer(out)
    killed.pick(0, 8)
    killed._commit(*killed._after)
    killed.pick(1, 8)
    manifest = {"complete": True, "step": 1, "run_id": "x", "mixture": killed._after[1]}
    (out / "manifest-step000001.json").write_text(json.dumps(manifest))  # step 1 reached disk, then the kill
    band = RejectListed(set())
    resumed = producer(out, task_filter=band)
    assert keys(resumed.pick(2, 8)) == steps[2]
    assert band.asked  # the filter was asked about every drawn task


def test_the_difficulty_band_is_built_only_when_asked_for():
    from hubgym.stats import DifficultyBand
    from hubgym.train.config import load_config
    from hubgym.train.online import difficulty_filter

    assert difficulty_filter(load_config("tiny").online) is None
    band = difficulty_filter(load_config("tiny", ["online.pass_band=[0.2, 0.8]"]).online)
    assert isinstance(band, DifficultyBand) and (band.low, band.high) == (0.2, 0.8)
    assert isinstance(band, TaskFilter)
    with pytest.raises(ValueError, match=re.escape("pass_band=(0.9, 0.1) must satisfy 0 <= low <= high <= 1")):
        load_config("tiny", ["online.pass_band=[0.9, 0.1]"])


MIX_SPEC = "envs:\n  - {name: 'arithmetic:*', weight: 1}\n  - {name: reverse_text, weight: 2}\n"


@pytest.mark.parametrize("args, said", [
    (["arithmetic", "--mix", "SPEC", "--tasks", "4"], "name the envs to sample (ENV[:CONFIG]...) or a mixture"),
    (["--mix", "SPEC"], "--mix draws --tasks N tasks from the mixture: give --tasks N"),
    (["arithmetic", "--tasks", "4"], "--tasks N is the number of tasks drawn from a mixture"),
    (["--mix", "MISSING", "--tasks", "4"], "cannot read mixture spec"),
])
def test_rollout_mix_options_are_checked_before_any_model_loads(tmp_path, args, said):
    from typer.testing import CliRunner

    from hubgym.cli import app

    spec = tmp_path / "mix.yaml"
    spec.write_text(MIX_SPEC)
    args = [str(spec) if a == "SPEC" else str(tmp_path / "missing.yaml") if a == "MISSING" else a for a in args]
    result = CliRunner().invoke(app, ["rollout", *args, "--out", str(tmp_path / "r")], env={"COLUMNS": "400"})
    assert result.exit_code == 1 and said in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_rollout_samples_a_mixture_and_resumes(tiny_model, tmp_path):
    from hubgym.hub.rollouts import iter_rollouts
    from hubgym.engines import SamplingArgs
    from hubgym.rollout import RolloutConfig, run_rollouts
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    spec = tmp_path / "mix.yaml"
    spec.write_text(MIX_SPEC)
    config = RolloutConfig(envs=[], mix=str(spec), tasks=6, model=str(tiny_model), out=str(tmp_path / "r"), n=2,
                           sampling=SamplingArgs(max_tokens=4, seed=3), max_model_len=512)
    first = run_rollouts(config, progress=False)
    assert not model_parallel_is_initialized()  # the engine this run started closed with it (its core ran here)
    rows = list(iter_rollouts([tmp_path / "r"]))
    assert first.written == len(rows) == 12 and len({r["task_id"] for r in rows}) == 6
    assert {r["env"] for r in rows} <= {"arithmetic", "reverse_text"}
    again = run_rollouts(config, progress=False)  # the same draws: every group is already stored
    assert (again.written, again.skipped) == (0, 12)
    spec.write_text(MIX_SPEC.replace("weight: 2", "weight: 3"))  # another mixture is another run
    assert RolloutConfig(**{**config.__dict__}).run_id() != first.run_id


def test_a_hub_env_streams_into_the_mixture_and_builders_write_no_cache(tmp_path):
    from hubgym.envs.push import push_env
    from hubgym.envs import opened as sources

    push_env("arithmetic", "me/arith", hub=tmp_path / "hub", configs=["easy"])
    mix = Mixture.from_spec(parse_spec([{"name": "me/arith:easy"}, {"name": "arithmetic:tiny"}]), split="train",
                            seed=0, listing=listing(), hub=str(tmp_path / "hub"), trust=True)
    batch = mix.take(40)
    hub_rows = [d for d in batch if d.env.key == "me/arith:easy"]
    assert hub_rows and len(hub_rows) < len(batch)
    opened = mix.opened(hub_rows[0].env)
    assert (opened.env, opened.config, opened.repo) == ("arithmetic", "easy", "me/arith") and len(opened.revision) == 40
    built = [p for p in Path(sources._CACHE_DIR.name).rglob("*") if not p.name.endswith(".lock")]
    assert built == []  # the builder's rows came from its generator: no datasets cache, no Arrow file


def test_a_resumed_producer_feeds_its_filter_every_stored_step_in_order(tmp_path):
    from hubgym.engines import SamplingArgs
    from hubgym.train.online import OnlineProducer

    class Recording(RejectListed):
        def update(self, rows):
            self.steps.append(rows[0]["step"])

    band = Recording(set())
    band.steps = []
    for step in (2, 0, 1):  # complete steps on disk (their shards stand in as one row each)
        (tmp_path / f"manifest-step{step:06d}.json").write_text(json.dumps({"complete": True, "step": step}))
    producer = OnlineProducer([("fake_0:a", 1.0)], split="train", model="m", out_dir=tmp_path, n=2,
                              sampling=SamplingArgs(), max_model_len=256, listing=fake_listing(1), task_filter=band)
    producer._stored_rows = lambda step: [{"step": step}]
    producer.pick(3, 2)
    producer.pick(3, 2)  # drawn again (a cancelled step): nothing fed twice
    assert band.steps == [0, 1, 2]
