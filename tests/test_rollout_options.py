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


def test_python_and_the_command_line_default_to_one_context_and_so_one_run_id(tiny_model):
    """No max_model_len is the model's own context, as `hubgym rollout` defaults it: the same rollout started from
    Python and from the command line is one run (one id), so either resumes the other."""
    from hubgym.models import context_length, resolve_model

    folder = resolve_model("tiny")
    as_the_cli_makes_it = RolloutConfig(envs=["arithmetic"], model=folder, out="runs/r",
                                        max_model_len=context_length(folder, None))
    assert BASE.max_model_len is None and BASE.run_id() == as_the_cli_makes_it.run_id()
    assert dataclasses.replace(BASE, max_model_len=1024).run_id() != BASE.run_id()  # another context: another run
    served = dataclasses.replace(BASE, engine="openai", base_url="http://127.0.0.1:9/v1")
    assert served.run_id() == dataclasses.replace(served, max_model_len=4096).run_id()  # a server's: the fallback


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


@pytest.mark.parametrize("item, said", [
    ("n=0", "n=0 must be a whole number >= 1"), ("limit=-1", "limit=-1 must be a whole number >= 1"),
    ("concurrency=0", "concurrency=0 must be a whole number >= 1"),
    ("max_rows_per_shard=0", "max_rows_per_shard=0 must be a whole number >= 1"),
    ("shard_index=2", "shard_index=2 must be below num_shards=1"),
    ("sampling.max_tokens=0", "sampling max_tokens=0 must be a whole number >= 1"),
    ("flush_every_s=.inf", "flush_every_s=inf must be a finite number of seconds > 0"),
    ("mode=fast", "mode='fast': use one of tokens, chat, chat_tokens"),
    ("engine=llama", "engine='llama': use one of vllm, openai"),
])
def test_a_value_the_command_line_would_bound_is_refused_however_it_is_set(item, said):
    """`--set` reaches past typer's bounds: the config holds them itself, for Python callers too."""
    with pytest.raises(SettingError) as info:
        with_options(BASE, [item])
    assert said in str(info.value) and "\n" not in str(info.value), str(info.value)
    key, _, value = item.partition("=")
    if "." not in key and key not in ("mode", "engine", "flush_every_s"):
        with pytest.raises(SettingError, match=said):
            dataclasses.replace(BASE, **{key: int(value)})


def test_pins_set_by_hand_are_held_to_the_pin_rule():
    from hubgym.errors import VerifierNotTrustedError

    assert with_options(BASE, ["pins={org/x@abc: " + "a" * 64 + "}"]).pins == {"org/x": "sha256:" + "a" * 64}
    with pytest.raises(VerifierNotTrustedError, match="is not a hub repo"):
        with_options(BASE, ["pins={a: b}"])
