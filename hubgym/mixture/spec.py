"""A mixture spec: which env configs a run draws tasks from, and how often.

    spec = load_mix_spec("mix.yaml")                 # or parse_spec({...}) / parse_spec([{name: ...}, ...])
    configs = expand(spec, listing())            # one EnvConfig per env config, with its final weight

A spec file (YAML or JSON) is either a list of entries or a mapping with `envs` and `tag_weights`:

    envs:
      - {name: arithmetic:easy, weight: 1}                 # one env config (ENV alone: its default config)
      - {name: "arithmetic:*", weight: 0.5}                # every config of one env
      - {name: arithmetic:hard, seed: 3, size: 100000}     # a config with its seed and split size overridden
      - {source: reasoning_gym, configs: all, weight: 1}   # every env of a family (each of its configs)
      - {tag: math, weight: 2}                             # every listed env carrying a tag
    tag_weights: {math: 2.0, games: 0.5}                   # multipliers by tag (0 leaves a tag out)

How weights combine: an env config's weight is the SUM of the weights of the entries that select it (each
entry gives its weight to every env config it selects, so a family of 100 envs at weight 1 is drawn 100 times
as often as one env at weight 1), times the PRODUCT of `tag_weights[t]` over the config's tags t (a tag not
in `tag_weights` multiplies by 1). Tasks are drawn with probability proportional to that weight.

An env, config, family or tag the listing does not know is one error that names it (with the closest known
names); nothing is opened or generated here.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hubgym.errors import EnvContractError, EnvNotFoundError, Where
from hubgym.files import read_config_text

__all__ = ["EnvConfig", "MixEntry", "MixSpec", "expand", "load_mix_spec", "parse_spec", "spec_digest"]


class MixEntry(BaseModel):
    """One line of a mixture: a selector (exactly one of name, source, tag) with a weight and overrides."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)  # a weight of .inf: no

    name: str | None = Field(None, description="env spec ENV[:CONFIG] (name, versioned id, folder or "
                             "org/name@revision); ENV:* selects every config of ENV")
    source: str | None = Field(None, description="select every env of this family (e.g. reasoning_gym)")
    tag: str | None = Field(None, description="select every listed env carrying this tag (e.g. math)")
    weight: float = Field(1.0, gt=0, description="mixture weight, given to each env config the entry selects")
    configs: Literal["default", "all"] | list[str] = Field("default", description="source/tag selectors: each "
                                                           "env's default config, all of them, or these names")
    seed: int | None = Field(None, description="override the config's seed (a distinct env config)")
    size: int | None = Field(None, gt=0, description="override the split's size (rows generated lazily)")

    @model_validator(mode="after")
    def _one_selector(self) -> MixEntry:
        """An entry that selects by two things at once is ambiguous; one that selects nothing is a typo."""
        given = [k for k in ("name", "source", "tag") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"an env entry selects by exactly one of name, source or tag; this one gives "
                             f"{', '.join(given) or 'none'}: write e.g. {{name: arithmetic:easy}}, "
                             f"{{source: reasoning_gym}} or {{tag: math}}")
        return self

    def plain_name(self) -> bool:
        """Only a name and a weight: the entry a list of `ENV[:CONFIG]` strings has always meant."""
        return self.name is not None and self.configs == "default" and self.seed is None and self.size is None

    def label(self) -> str:
        """How a run id and a manifest record the entry: its name when plain, else canonical JSON."""
        if self.plain_name():
            return str(self.name)
        return json.dumps(self.model_dump(exclude_none=True, exclude={"weight"}), sort_keys=True)


class MixSpec(BaseModel):
    """A whole mixture: entries plus tag multipliers."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    envs: list[MixEntry] = Field(min_length=1)
    tag_weights: dict[str, float] = Field(default_factory=dict)

    @field_validator("tag_weights")
    @classmethod
    def _finite_multipliers(cls, weights: dict[str, float]) -> dict[str, float]:
        bad = {t: w for t, w in weights.items() if not (w >= 0 and math.isfinite(w))}
        if bad:
            raise ValueError(f"tag_weights {bad} must be finite and >= 0 (0 leaves the tag's envs out)")
        return weights


@dataclass(frozen=True)
class EnvConfig:
    """One env config of an expanded mixture: what to open, and how often to draw it."""

    key: str  # unique within the mixture: "arithmetic:hard", "arithmetic:hard?seed=3&size=1000"
    ref: str  # what resolves to code: an env name, a path or a hub ref org/name@rev
    config: str | None  # None: the env's default (a hub env not listed)
    weight: float
    name: str  # the env name rows carry (the listed name; the ref for a hub env until it is opened)
    tags: tuple[str, ...] = ()
    source: str = ""
    seed: int | None = None
    size: int | None = None
    tools: tuple[str, ...] = ()  # tools its rows may offer (a builder's TOOLS; a tool_use family env: some)


def parse_spec(data: Any, origin: str = "mixture spec") -> MixSpec:
    """A spec from parsed YAML/JSON (a list of entries or a mapping), or a list of "ENV[:CONFIG]" strings."""
    if isinstance(data, list):
        data = {"envs": data}
    if isinstance(data, dict) and isinstance(data.get("envs"), list):
        data = {**data, "envs": [{"name": e} if isinstance(e, str) else e for e in data["envs"]]}
    try:
        return MixSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg'].removeprefix('Value error, ')}"
                             for e in exc.errors())
        raise EnvContractError(f"{origin} is not a valid mixture: {problems}", Where(field="envs"),
                               "write a list of {name|source|tag, weight} (the format: hubgym.mixture.spec)") from None


def load_mix_spec(path: str | Path) -> MixSpec:
    """Read a YAML or JSON spec file (JSON is YAML): a regular file of UTF-8 text of at most MAX_CONFIG_BYTES (a
    FIFO or a device would block or never end: hubgym.files.read_config_text), nested no deeper than YAML's parser
    recurses."""
    path = Path(path)
    try:
        data = yaml.safe_load(read_config_text(path))
    except (ValueError, yaml.YAMLError, RecursionError) as exc:
        problem = "nested too deep" if isinstance(exc, RecursionError) else str(exc).splitlines()[0][:200]
        raise EnvContractError(f"cannot read mixture spec {path}: {problem}", Where(field="envs"),
                               "give a readable YAML or JSON file (UTF-8 text)") from None
    return parse_spec(data, origin=f"mixture spec {path}")


def spec_digest(spec: MixSpec) -> str:
    """A short content hash of a spec (weights included): what a rollout run's id records."""
    text = json.dumps(spec.model_dump(exclude_none=True), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def expand(spec: MixSpec, listing: Any) -> list[EnvConfig]:
    """Every env config the spec selects, each with its weight (summed over entries, times its tag weights).

    `listing` is a `hubgym.envs.listing.Listing` (the catalog: built-ins, entry points, families)."""
    found: dict[str, dict[str, Any]] = {}
    for entry in spec.envs:
        for picked in _select(entry, listing):
            slot = found.setdefault(picked["key"], {**picked, "weight": 0.0})
            slot["weight"] += entry.weight
    known_tags = {t for item in found.values() for t in item["tags"]} | set(listing.tags())
    for tag in spec.tag_weights:
        if tag not in known_tags:
            raise _unknown("tag", tag, sorted(known_tags), "tag_weights")
    configs = []
    for item in found.values():
        weight = item["weight"] * math.prod(spec.tag_weights.get(t, 1.0) for t in item["tags"])
        if weight > 0:
            configs.append(EnvConfig(**{**item, "weight": weight}))
    if not configs:
        raise EnvContractError("every env config of the mixture has weight 0 (tag_weights leave them all out)",
                               Where(field="tag_weights"), "give at least one selected tag a weight above 0")
    return configs


def _no_config(listing: Any, ref: str, env: Any, config: str) -> EnvContractError:
    """The builder's own error (it names why a family left the config out); the plain one when the builder itself
    does not load (that error belongs to whoever opens the env)."""
    from hubgym.builders.base import no_config_error  # the error path only: it imports datasets

    fix = f"write ENV:CONFIG with one of its configs: {', '.join(env.configs)}"
    try:
        return listing.builder(ref).no_config(config, fix)
    except Exception:
        return no_config_error(env.name, config, fix)


def _select(entry: MixEntry, listing: Any) -> list[dict[str, Any]]:
    if entry.source is not None:
        listed = listing.by_source(entry.source)
        if not listed:
            raise _unknown("source", entry.source, listing.sources(), "source")
        return [c for env in listed for c in _configs_of(env, entry)]
    if entry.tag is not None:
        listed = listing.by_tag(entry.tag)
        if not listed:
            raise _unknown("tag", entry.tag, listing.tags(), "tag")
        return [c for env in listed for c in _configs_of(env, entry)]
    ref, _, config = str(entry.name).partition(":")
    env = listing.find(ref)
    if env is None:  # a hub env: not opened here (its configs and tags are known once it is)
        return [_picked(ref, config or None, ref, (), "hub", entry, tools=())]
    if config == "*":
        return _configs_of(env, entry.model_copy(update={"configs": "all"}))
    if config and config not in env.configs:
        raise _no_config(listing, ref, env, config)
    return [_picked(ref, config or env.configs[0], env.name, env.tags, env.source, entry, env.tools)]


def _configs_of(env: Any, entry: MixEntry) -> list[dict[str, Any]]:
    wanted = ([env.configs[0]] if entry.configs == "default" else list(env.configs) if entry.configs == "all"
              else [c for c in entry.configs if c in env.configs])
    if not wanted:
        raise EnvContractError(f"env {env.name!r} has none of the configs {entry.configs}",
                               Where(env=env.name, field="configs"),
                               f"name configs it has ({', '.join(env.configs)}), or use configs: default | all")
    return [_picked(env.name, c, env.name, env.tags, env.source, entry, env.tools) for c in wanted]


def _picked(ref: str, config: str | None, name: str, tags: tuple[str, ...], source: str, entry: MixEntry,
            tools: tuple[str, ...]) -> dict[str, Any]:
    overrides = "&".join(f"{k}={v}" for k, v in (("seed", entry.seed), ("size", entry.size)) if v is not None)
    key = f"{ref}:{config}" if config else ref
    return {"key": f"{key}?{overrides}" if overrides else key, "ref": ref, "config": config, "name": name,
            "tags": tuple(tags), "source": source, "seed": entry.seed, "size": entry.size, "tools": tuple(tools)}


def _unknown(what: str, value: str, known: list[str], field: str) -> EnvNotFoundError:
    near = difflib.get_close_matches(value, known, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(near)}? " if near else ""
    shown = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "")
    return EnvNotFoundError(f"the mixture names {what} {value!r}, which no listed env has [field={field!r}]; "
                            f"{hint}known {what}s: {shown or '(none)'}")
