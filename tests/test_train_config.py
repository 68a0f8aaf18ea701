"""`hubgym train CONFIG.yaml --set key=value`: YAML and overrides merge, and mistakes are named with the fix."""

from __future__ import annotations

import pytest

from hubgym.train.config import ConfigError, describe_options, load_config


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("online:\n  steps: 5\nenvs:\n  - {name: wordle, weight: 2}\noptim:\n  bf16: false\n")
    cfg = load_config(path, ["online.steps=7", "loss.variant=dapo", "offline.sources=[runs/a, runs/b]"])
    assert cfg.online.steps == 7 and cfg.total_steps == 7
    assert cfg.loss.variant == "dapo" and cfg.offline.sources == ["runs/a", "runs/b"]
    assert [(e.name, e.weight) for e in cfg.envs] == [("wordle", 2.0)]
    assert cfg.optim.bf16 == "false"  # YAML's boolean, as the DeepSpeed setting expects it


def test_unknown_option_suggests_the_closest(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown training option 'online\.step'; did you mean 'online\.steps'\?"):
        load_config(None, ["online.step=3"])


def test_invalid_value_names_the_key():
    with pytest.raises(ConfigError, match=r"loss\.variant: Input should be 'grpo', 'dr_grpo' or 'dapo'"):
        load_config(None, ["loss.variant=ppo"])
    with pytest.raises(ConfigError, match=r"write key=value"):
        load_config(None, ["online.steps"])


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match=r"the top level must be a mapping"):
        load_config(path)


def test_every_option_is_documented():
    options = list(describe_options())
    assert len(options) > 30
    assert all(description for _, _, description in options), [k for k, _, d in options if not d]


def test_a_staleness_bound_below_the_schedule_is_refused():
    # rows sampled one step ahead by weights synced every 3 steps lag up to 1 + 3 - 1 = 3 versions
    base = ["online.steps=6", "online.async_steps=1", "online.sync_every=3"]
    assert load_config(None, base + ["loss.max_staleness=3"]).loss.max_staleness == 3
    with pytest.raises(ConfigError, match=r"loss\.max_staleness=2 is below the lag the schedule gives online rows "
                                          r"\(online\.async_steps \+ online\.sync_every - 1 = 3\)"):
        load_config(None, base + ["loss.max_staleness=2"])
    with pytest.raises(ConfigError, match=r"= 3\)"):  # sync_every alone lags too
        load_config(None, ["online.steps=6", "online.sync_every=4", "loss.max_staleness=2"])
    assert load_config(None, ["offline.sources=[runs/a]", "offline.steps=5", "loss.max_staleness=0"])  # no online


def test_stored_rollout_steps_need_sources():
    with pytest.raises(ConfigError, match=r"offline\.steps=5 .* need stored rollouts, but offline\.sources is empty"):
        load_config(None, ["offline.steps=5"])
    with pytest.raises(ConfigError, match=r"online\.offline_fraction=0\.5 need stored rollouts"):
        load_config(None, ["online.steps=5", "online.offline_fraction=0.5"])
    with pytest.raises(ConfigError, match=r"offline\.sources: lists runs/a more than once; list each source once"):
        load_config(None, ["offline.sources=[runs/a, runs/b, runs/a]", "offline.steps=1"])
