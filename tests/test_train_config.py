"""`hubgym train CONFIG.yaml --set key=value`: YAML and overrides merge, and mistakes are named with the fix.
Every range is the config's: a value it accepts is one the loss and the trainer accept."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from hubgym.train.config import ConfigError, Section, TrainConfig, describe_options, load_config
from hubgym.train.groups import make_group
from hubgym.train.loss import LossSettings
from hubgym.train.trainer import deepspeed_settings, group_settings, loss_settings


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


# -- every range in one place: what the config accepts, the loss and the trainer accept ---------------

BOUNDARY = {"ge": (0, -1), "gt": (1, 0), "le": (0, 1), "lt": (-1, 0)}  # (inside step, outside step) from the limit
SYMBOL = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def ranged_options():
    """(key, kind, limit, is_int) for every numeric option with a bound."""
    for section, field in TrainConfig.model_fields.items():
        annotation = field.annotation
        if not (isinstance(annotation, type) and issubclass(annotation, Section)):
            continue
        for name, option in annotation.model_fields.items():
            for bound in option.metadata:
                for kind in BOUNDARY:
                    if getattr(bound, kind, None) is not None:
                        is_int = option.annotation in (int, int | None)
                        yield f"{section}.{name}", kind, getattr(bound, kind), is_int


def test_the_ranged_options_cover_loss_and_optim():
    keys = {key for key, *_ in ranged_options()}
    assert {"loss.epsilon_low", "loss.epsilon_high", "loss.beta", "loss.is_cap", "loss.max_staleness",
            "optim.lr", "optim.weight_decay", "optim.max_grad_norm", "sampling.max_tokens"} <= keys


BASE = ["offline.sources=[runs/a]"]  # so that options needing stored rollouts validate on their own


@pytest.mark.parametrize("key, kind, limit, is_int", list(ranged_options()), ids=lambda v: str(v))
def test_a_value_the_config_accepts_is_one_the_loss_and_the_trainer_accept(key, kind, limit, is_int):
    inside, outside = BOUNDARY[kind]
    step = 1 if is_int else 1e-3
    value = limit + inside * step
    cfg = load_config(None, BASE + [f"{key}={value}"])
    loss_settings(cfg), group_settings(cfg), deepspeed_settings(cfg)  # what the trainer builds: no error
    bad = limit + outside * (1 if is_int else 0.5)
    with pytest.raises(ConfigError, match=rf"^invalid training config: {re.escape(key)}={re.escape(repr(bad))} "
                                          rf"must be {re.escape(SYMBOL[kind])} {limit:g}; set it to "):
        load_config(None, BASE + [f"{key}={bad}"])


def test_is_cap_below_one_is_refused_once_in_the_config_with_the_value_the_invariant_and_the_fix():
    message = ("loss.is_cap=0.5 must be >= 1; set it to 1 or more (cap of the importance weight vs behaviour "
               "logprobs; below 1 it would cap the on-policy tokens too)")
    with pytest.raises(ConfigError, match=f"^invalid training config: {re.escape(message)}$"):
        load_config(None, ["loss.is_cap=0.5"])
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):  # settings built in code: the same rule
        LossSettings(is_cap=0.5)
    assert loss_settings(load_config(None, ["loss.is_cap=1"])).is_cap == 1.0


def test_dr_grpo_leaves_the_std_out_of_the_advantages():
    cfg = load_config(None, ["loss.variant=dr_grpo"])
    assert cfg.grpo.advantage == "dr_grpo"
    rows = [{"reward": r, "group": "g", "env": "e"} for r in (0.0, 0.0, 0.0, 0.1)]
    group = make_group(rows, group_settings(cfg), Counter())
    assert group.advantages == pytest.approx([-0.025, -0.025, -0.025, 0.075])  # R - mean, not / std (0.043)
    assert load_config(None, ["loss.variant=dr_grpo", "grpo.advantage=dr_grpo"]).grpo.advantage == "dr_grpo"
    assert load_config(None, ["grpo.advantage=dr_grpo"]).grpo.advantage == "dr_grpo"  # no std with any variant
    assert load_config(None, ["loss.variant=dapo"]).grpo.advantage == "grpo"
    with pytest.raises(ConfigError, match=r"^invalid training config: loss\.variant=dr_grpo leaves the group std out "
                                          r"of the advantages \(Dr\. GRPO\), but grpo\.advantage=grpo divides by it; "
                                          r"leave grpo\.advantage unset"):
        load_config(None, ["loss.variant=dr_grpo", "grpo.advantage=grpo"])


def test_online_rollouts_must_fit_one_micro_batch():
    base = ["online.steps=2", "online.max_model_len=2048"]
    assert load_config(None, base + ["batch.micro_batch_tokens=2048"]).batch.micro_batch_tokens == 2048
    with pytest.raises(ConfigError, match=r"^invalid training config: batch\.micro_batch_tokens=1024 is below "
                                          r"online\.max_model_len=2048, the length an online rollout can reach.*; "
                                          r"set batch\.micro_batch_tokens to 2048 or more, or lower "
                                          r"online\.max_model_len$"):
        load_config(None, base + ["batch.micro_batch_tokens=1024"])
    assert load_config(None, ["online.max_model_len=2048", "batch.micro_batch_tokens=1024"])  # no online steps
