"""`hubgym rollout --set key=value`: every RolloutConfig field is an option with a description, values reach the
config typed and checked, and a bad key or value is one SettingError naming it."""

from __future__ import annotations

import dataclasses

import pytest

from hubgym.errors import SettingError
from hubgym.rollout.options import HELP, rollout_options, with_options
from hubgym.rollout.run import RolloutConfig

BASE = RolloutConfig(envs=["arithmetic"], model="tiny", out="runs/r")


def test_every_field_of_the_config_is_an_option_with_a_description():
    keys = [key for key, _, _ in rollout_options()]
    fields = {f.name for f in dataclasses.fields(RolloutConfig)}
    assert {key.split(".")[0] for key in keys} == fields
    assert set(keys) == set(HELP), "a RolloutConfig field without a line in HELP (or a line for no field)"
    assert "sampling.top_p" in keys and "vllm.tensor_parallel_size" in keys


def test_set_values_reach_the_config_typed_and_nested():
    config = with_options(BASE, ["sampling.top_p=0.9", "concurrency=3", "vllm.dtype=bfloat16", "limit=null",
                                 "chat_template_kwargs={enable_thinking: false}", "tool_parser=qwen3_coder"])
    assert config.sampling.top_p == 0.9 and config.sampling.temperature == BASE.sampling.temperature
    assert config.concurrency == 3 and config.vllm.dtype == "bfloat16" and config.limit is None
    assert config.chat_template_kwargs == {"enable_thinking": False} and config.tool_parser == "qwen3_coder"
    assert with_options(BASE, []) is BASE
    assert with_options(BASE, ["concurrency=3"]).run_id() == BASE.run_id()  # how a run is spread is not its id
    assert with_options(BASE, ["vllm.dtype=bfloat16"]).run_id() != BASE.run_id()  # what it samples with is


@pytest.mark.parametrize("item, said", [
    ("concurency=3", "--set concurency: no such rollout option; did you mean 'concurrency'?"),
    ("n=many", "--set n='many': Input should be a valid integer"),
    ("sampling.temperature=-1", "sampling temperature=-1"),
    ("sampling.top_p=.nan", "sampling top_p=nan must be a finite number"),
    ("chat_template_kwargs=[1]", "--set chat_template_kwargs=[1]: Input should be a valid dictionary"),
    ("=3", "--set '=3': write key=value"),
])
def test_a_bad_option_is_one_line_naming_it(item, said):
    with pytest.raises(SettingError) as info:
        with_options(BASE, [item])
    assert said in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_engine_settings_are_refused_for_a_server_and_checked_for_the_offline_engine():
    from hubgym.engines import EngineSettings
    from hubgym.errors import EngineError

    EngineSettings().check_for("openai")  # the defaults ask nothing of a server
    with pytest.raises(EngineError, match=r"^vllm.\* settings start a local vLLM engine; with engine openai"):
        EngineSettings(dtype="bfloat16").check_for("openai")
    with pytest.raises(EngineError, match=r"^vllm.dtype='fp8' is not a vLLM dtype"):
        EngineSettings(dtype="fp8").check_for("vllm")
