"""Every option of a rollout run as `key=value` (what `hubgym rollout --set` takes and `--options` lists).

    config = with_options(RolloutConfig(envs=["wordle"], model="tiny", out="runs/r1"),
                          ["sampling.top_p=0.9", "vllm.dtype=bfloat16", "concurrency=64"])
    for key, default, what in rollout_options(): ...

Keys are RolloutConfig's fields, dotted into its sections (`sampling.*`, `vllm.*`), as in `hubgym train`'s
config. Values are YAML scalars (3, 0.5, true, null, {a: 1}). The whole config is validated at once, so a bad
value is one line naming its key; an unknown key names the closest known one.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Iterator

import yaml

from hubgym.errors import SettingError
from hubgym.rollout.run import RolloutConfig

HELP: dict[str, str] = {
    "envs": "ENV or ENV:CONFIG (name, versioned id or folder), one or more",
    "model": "model folder, or the name served at base_url; 'tiny' makes a tiny local model",
    "out": "run folder (re-running resumes)",
    "engine": "vllm: vLLM's offline engine in this process; openai: an OpenAI-compatible server at base_url",
    "vllm.dtype": "engine vllm: weights and activations; auto: vLLM's choice on a GPU (bfloat16 for an fp32 "
                  "checkpoint), float32 on a CPU",
    "vllm.gpu_memory_utilization": "engine vllm: share of the GPU's memory vLLM takes, in (0, 1] (null: vLLM's 0.9)",
    "vllm.tensor_parallel_size": "engine vllm: GPUs the engine spans",
    "vllm.enable_sleep_mode": "engine vllm, GPU only: vLLM can sleep (a trainer beside it uses this)",
    "vllm.enforce_eager": "engine vllm: skip torch.compile (starts sooner, decodes slower; short runs on a CPU)",
    "base_url": "engine openai: the endpoint, e.g. http://127.0.0.1:8000/v1",
    "mode": "engine openai: tokens (token-in), chat (the server renders, native tool calls) or chat_tokens",
    "n": "samples per task (one GRPO group)",
    "limit": "tasks per env, the first ones of the split (null: the whole split)",
    "split": "split to sample tasks from",
    "sampling.temperature": "sampling temperature, >= 0",
    "sampling.top_p": "nucleus sampling, in (0, 1]",
    "sampling.max_tokens": "tokens per turn, unless a task's interaction spec says otherwise",
    "sampling.seed": "per-request seeds derive from it, so a run is reproducible",
    "sampling.regex": "constrain every reply to this regular expression (vLLM structured outputs)",
    "max_model_len": "context length (default: the model's own, from its config.json; a server's: 4096)",
    "policy_version": "the policy version recorded in each row's provenance",
    "shard_index": "this worker's index, for workers started by hand",
    "num_shards": "number of workers splitting the tasks",
    "max_rows_per_shard": "rows per Arrow shard file",
    "flush_every_s": "finished groups reach disk within this many seconds, full shard or not",
    "concurrency": "groups sampled at once (one vLLM batch at most; bounds a run's memory)",
    "hub": "where org/name@revision envs load from: 'hf', a Hub-API URL or a local hub folder",
    "trust": "run hub envs' verifiers unpinned",
    "pins": "hub repo -> sha256:<hex> its code must have (the CLI's --pin REPO=sha256:<hex>)",
    "tool_parser": "how tool calls are read from replies: hermes (<tool_call> JSON) or any vLLM tool-call parser",
    "reasoning_parser": "a vLLM reasoning parser (qwen3, deepseek_r1, ...): <think> text goes to `reasoning`",
    "chat_template_kwargs": "passed to every apply_chat_template, e.g. {enable_thinking: false}",
    "mix": "a mixture spec file (YAML/JSON): draw `tasks` tasks from it instead of `envs`",
    "tasks": "with mix: how many tasks to draw (no task twice)",
}


def rollout_options(config: Any = None, prefix: str = "") -> Iterator[tuple[str, str, str]]:
    """(key, default, description) of every option, sections flattened: the option reference."""
    config = config if config is not None else RolloutConfig(envs=[], model="tiny", out="runs/rollout")
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            yield from rollout_options(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", repr(value), HELP.get(f"{prefix}{f.name}", "")


def with_options(config: RolloutConfig, sets: list[str]) -> RolloutConfig:
    """`config` with each `key=value` applied, validated as a whole; SettingError naming the key otherwise."""
    from pydantic import TypeAdapter, ValidationError

    if not sets:
        return config
    data, known = dataclasses.asdict(config), [key for key, _, _ in rollout_options()]
    for item in sets:
        _apply(data, item, known)
    try:
        return TypeAdapter(RolloutConfig).validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(map(str, first["loc"]))
        problem = first["msg"].removeprefix("Value error, ")
        if not key or first["type"] == "value_error":  # a rule of the config's own: its message names the option
            raise SettingError(f"--set: {problem} (`hubgym rollout --options` lists every option)") from None
        raise SettingError(f"--set {key}={_value_at(data, first['loc'])!r}: {problem} (`hubgym rollout --options` "
                           f"lists every option)", setting=key) from None


def _apply(data: dict, item: str, known: list[str]) -> None:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SettingError(f"--set {item!r}: write key=value, e.g. --set sampling.top_p=0.9", setting=item)
    if key not in known:
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SettingError(f"--set {key}: no such rollout option{hint} (`hubgym rollout --options` lists every "
                           f"option)", setting=key)
    try:
        value = yaml.safe_load(raw)  # YAML scalars: 3, 0.5, true, null, {a: 1}
    except yaml.YAMLError as exc:
        raise SettingError(f"--set {key}: {raw!r} is not a YAML value ({exc.problem}); quote text, e.g. "
                           f"{key}='a: b'", setting=key) from None
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        node = node[part]
    node[leaf] = value


def _value_at(data: dict, loc: tuple) -> Any:
    node: Any = data
    for part in loc:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return node
    return node
