"""The Task row: what a builder emits and what `load_dataset(env_repo)` returns.

A task row is plain data: the prompt, an `info` JSON blob holding everything the verifier
needs, and an `interaction` spec that tells the rollout loop how to drive the episode.
"""

from __future__ import annotations

import hashlib
import math
import json
import re
from typing import Any, Literal, TypedDict

import datasets
import msgspec

from hubgym.errors import EnvContractError, Where
from hubgym.schemas.messages import MESSAGE_FEATURES, Message, normalize

Kind = Literal["single_turn", "tool_use", "multi_turn"]
ENV_NAME_RULE = "1-64 ASCII letters, digits and '_', starting with a letter"
ENV_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
"""An env name (a builder's ENV, a row's `env`): also a Python identifier, since it names an env folder, a verifier
module and a class (hubgym.envs.refs parses references with it; the row contract holds stored rows to it)."""
KINDS: tuple[str, ...] = ("single_turn", "tool_use", "multi_turn")


class ToolReward(TypedDict):
    """Per-call shaping: each successful call to `tool` earns `reward`, for at most `max_calls` calls."""

    tool: str
    reward: float
    max_calls: int


class Interaction(TypedDict):
    kind: Kind
    max_turns: int  # assistant turns allowed before the episode is cut (truncated)
    max_tokens: int | None  # per-turn generation budget; None = the rollout's default
    tools: list[str]  # names from the tool registry
    tool_rewards: list[ToolReward]


class Task(TypedDict):
    """One task row, as a builder yields it and `load_dataset` returns it: what the model is asked (`prompt`),
    what only the verifier reads (`info`, JSON-safe), and how the episode runs (`interaction`: single turn, tools,
    or a multi-turn game). `id` is unique within the env and stable across builds of the same version."""

    id: str
    env: str
    prompt: list[Message]
    info: dict[str, Any]
    interaction: Interaction
    split: str | None
    difficulty: str | None
    tags: list[str]


INTERACTION_FEATURES = {
    "kind": datasets.Value("string"),
    "max_turns": datasets.Value("int32"),
    "max_tokens": datasets.Value("int32"),
    "tools": datasets.List(datasets.Value("string")),
    "tool_rewards": datasets.List(
        {"tool": datasets.Value("string"), "reward": datasets.Value("float64"), "max_calls": datasets.Value("int32")}
    ),
}
TASK_FEATURES = datasets.Features(
    {
        "id": datasets.Value("string"),
        "env": datasets.Value("string"),
        "prompt": datasets.List(MESSAGE_FEATURES),
        "info": datasets.Json(),
        "interaction": INTERACTION_FEATURES,
        "split": datasets.Value("string"),
        "difficulty": datasets.Value("string"),
        "tags": datasets.List(datasets.Value("string")),
    }
)
TASK_SCHEMA = TASK_FEATURES.arrow_schema
TASK_COLUMNS: tuple[str, ...] = tuple(TASK_FEATURES)


def interaction(
    kind: Kind = "single_turn",
    *,
    max_turns: int = 1,
    max_tokens: int | None = None,
    tools: list[str] | tuple[str, ...] = (),
    tool_rewards: list[ToolReward] | tuple[ToolReward, ...] = (),
) -> Interaction:
    """An interaction spec with every key present."""
    return {
        "kind": kind,
        "max_turns": max_turns,
        "max_tokens": max_tokens,
        "tools": list(tools),
        "tool_rewards": [dict(r) for r in tool_rewards],
    }


def canonical_json(value: Any) -> str:
    """Deterministic JSON (sorted keys, no spaces): the basis of content-derived ids and hashes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


_DECODE_JSON = msgspec.json.Decoder().decode


def parse_json(text: str) -> Any:
    """`json.loads`, ~7x faster (the `info` column is decoded once per row read); falls back to it for what
    msgspec refuses (NaN and Infinity, which Python's json writes)."""
    try:
        return _DECODE_JSON(text)
    except msgspec.DecodeError:
        return json.loads(text)


def _check_json(value: Any, path: str, env: str) -> None:
    """Refuse a value JSON cannot hold (a datetime, a set, a NaN...), naming its place, e.g. `info.when`."""
    bad = _not_json(value, path)
    if bad is not None:
        at, kind = bad
        raise EnvContractError(f"{at} is {kind}, which the info column (JSON) cannot hold", Where(env=env, field=at),
                               "store it as JSON data: text (e.g. a date's .isoformat()), a finite number, a list or "
                               "a dict with string keys")


def _not_json(value: Any, path: str) -> tuple[str, str] | None:
    """(path, what it is) of the first value inside `value` that is not JSON data; None when all of it is."""
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, f"the float {value}")
    if isinstance(value, (list, tuple)):
        return next((bad for i, v in enumerate(value) if (bad := _not_json(v, f"{path}[{i}]"))), None)
    if isinstance(value, dict):
        for key, v in value.items():
            if not isinstance(key, str):
                return f"{path}[{key!r}]", f"a key of type {type(key).__name__}"
            bad = _not_json(v, f"{path}.{key}")
            if bad:
                return bad
        return None
    return path, f"a {type(value).__module__}.{type(value).__qualname__}".replace("builtins.", "")


def as_stored(info: dict[str, Any]) -> dict[str, Any]:
    """`info` as the info column (a `datasets.Json` feature) gives it back: its JSON encoding keeps about ten
    significant digits of a float (3500.0000000000005 comes back as 3500.0); other values are unchanged."""
    feature = TASK_FEATURES["info"]
    return feature.decode_example(feature.encode_example(info)) if _has_float(info) else info


def _has_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_float(v) for v in value)
    return False


def task_id(env: str, prompt: list[Message], info: dict[str, Any], spec: Interaction) -> str:
    """`<env>-<16 hex>`: a hash of the content, so the same config and seed give the same ids."""
    digest = hashlib.sha256(canonical_json([env, prompt, info, spec]).encode()).hexdigest()
    return f"{env}-{digest[:16]}"


def make_task(
    env: str,
    prompt: list[Message] | list[dict],
    info: dict[str, Any],
    spec: Interaction | None = None,
    *,
    split: str | None = None,
    difficulty: str | None = None,
    tags: list[str] | tuple[str, ...] = (),
) -> Task:
    """Build a complete task row; the id is derived from env, prompt, info and interaction.

    `info` is taken in the form the info column stores (`as_stored`): a float with more digits than it keeps
    is rounded here, so a row read back, a row generated on the fly and the id agree."""
    prompt = [normalize(m) for m in prompt]
    spec = spec or interaction()
    _check_json(info, "info", env)
    info = as_stored(info)
    return {
        "id": task_id(env, prompt, info, spec),
        "env": env,
        "prompt": prompt,
        "info": info,
        "interaction": spec,
        "split": split,
        "difficulty": difficulty,
        "tags": list(tags),
    }
