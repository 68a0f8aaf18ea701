"""The dataset card (README.md) of a pushed env: YAML `configs:` for `load_dataset`, and a page for people.

The YAML lists every config's data files per split, so `load_dataset(repo, CONFIG, split=...)`
works on the Hub and on a local snapshot with no remote code. The page says what the env is
(kind, tools, reward components, sizes, an example row) and how to load it with hubgym.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import yaml

from hubgym.hub.manifest import VERIFIER_FILE

_MAX_TEXT = 240  # characters of a string shown in the example row


def render_card(manifest: dict, repo: str, example: dict[str, Any] | None, builder_doc: str | None) -> str:
    """README.md text: YAML front matter, then the human description."""
    sections = [_front_matter(manifest), _summary(manifest), _rewards(manifest), _sizes(manifest),
                _example(manifest, example), _usage(manifest, repo)]
    if builder_doc:
        sections.append(f"## About the environment\n\n```text\n{inspect.cleandoc(builder_doc)}\n```\n")
    return "\n".join(sections)


def _front_matter(manifest: dict) -> str:
    configs = []
    for name, config in manifest["configs"].items():
        entry: dict[str, Any] = {"config_name": name}
        if name == manifest["default_config"]:
            entry["default"] = True
        entry["data_files"] = [{"split": s, "path": v["files"]} for s, v in config["splits"].items()]
        configs.append(entry)
    meta = {"pretty_name": manifest["env_id"], "tags": ["hubgym", "reinforcement-learning", "rl-environment"],
            "configs": configs}
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def _summary(manifest: dict) -> str:
    v = manifest["verifier"]
    lo, hi = v["reward_range"]
    rows = [("environment", f"`{manifest['env']}` version {manifest['env_version']}"),
            ("interaction kind", manifest["kind"]),
            ("tools", ", ".join(f"`{t}`" for t in manifest["tools"]) or "none"),
            ("reward range", f"{lo} to {hi} (success at {v['success_threshold']})"),
            ("verifier", f"`{VERIFIER_FILE}`, sha256 `{v['sha256']}`"),
            *([("tools module", f"`{manifest['tools_module']['path']}`, sha256 `{manifest['tools_module']['sha256']}`"
                )] if manifest.get("tools_module") else []),
            ("code pin", f"`sha256:{manifest['code']['sha256']}`"),
            ("task schema", f"hubgym {manifest['schema_version']}")]
    table = "\n".join(f"| {k} | {val} |" for k, val in rows)
    return (f"# {manifest['env_id']}\n\nA hubgym environment: task rows for a language model, and a pure verifier "
            f"module that scores what the model did.\n\n| | |\n|---|---|\n{table}\n")


def _rewards(manifest: dict) -> str:
    v = manifest["verifier"]
    lines = [f"| `{name}` | {weight}{' (a metric: not in the reward)' if weight == 0 else ''} |"
             for name, weight in v["rewards"].items()]
    extra = []
    if v["multi_turn"]:
        extra.append("the per-step rewards of the environment's `step` add up as component `steps`")
    if manifest.get("tool_rewards"):
        shaped = ", ".join(f"`{t}`" for t in manifest["tool_rewards"])
        extra.append(f"successful calls to {shaped} earn the per-call rewards of `interaction.tool_rewards` "
                     f"(component `tool_calls`)")
    tail = "".join(f"\nPlus: {e}." for e in extra)
    return "## Reward\n\nThe total reward is the weighted sum of:\n\n| component | weight |\n|---|---|\n" \
           + "\n".join(lines) + f"\n{tail}\n"


def _sizes(manifest: dict) -> str:
    lines = [f"| {name} | {split} | {info['num_rows']} |"
             for name, config in manifest["configs"].items() for split, info in config["splits"].items()]
    params = "\n".join(f"- `{name}`: `{json.dumps(config['params'], sort_keys=True)}`"
                       for name, config in manifest["configs"].items())
    return "## Configs and sizes\n\n| config | split | rows |\n|---|---|---|\n" + "\n".join(lines) \
           + f"\n\nBuilder parameters:\n\n{params}\n"


def _example(manifest: dict, example: dict[str, Any] | None) -> str:
    if example is None:
        return ""
    text = json.dumps(_shorten(example), indent=2, ensure_ascii=False)
    return f"## Example row (config `{manifest['default_config']}`)\n\n```json\n{text}\n```\n"


def _usage(manifest: dict, repo: str) -> str:
    config, sha = manifest["default_config"], manifest["code"]["sha256"]
    code = ", ".join(f"`{path}`" for path in manifest["code"]["files"])
    split = next(iter(manifest["configs"][config]["splits"]))
    return f"""## How to use

The tasks are plain data:

```python
from datasets import load_dataset

tasks = load_dataset("{repo}", "{config}", split="{split}")
```

With hubgym, the tasks come with their verifier. The env's code ({code}) runs only when its sha256
(`sha256sum` of its files, in path order, hashed again) matches a pin you give (read the files first), or
when you pass `trust=True`:

```python
import hubgym

env = hubgym.load_env("{repo}@<revision>", pin="sha256:{sha}", config="{config}", split="{split}")
score = env.verifier.score(env.tasks[0], completion)   # env.tasks: a Dataset; completion: a list of messages
```

Without `split=`, `env.tasks` is a `DatasetDict` of every split, as `load_dataset` gives. From the
command line: `hubgym rollout {repo}@<revision> --pin {repo}=sha256:{sha}`. Add `hub=` (`--hub`)
when the repo is not on your default hub.
"""


def _shorten(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= _MAX_TEXT else value[:_MAX_TEXT] + "..."
    if isinstance(value, list):
        return [_shorten(v) for v in value]
    if isinstance(value, dict):
        return {k: _shorten(v) for k, v in value.items()}
    return value
