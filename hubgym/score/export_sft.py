"""Stored rollouts as a fine-tuning dataset (`hubgym export sft`): the conversational form TRL's SFTTrainer takes.

    result = export_sft(["runs/r1", "org/rollouts@3f1c2e9"], "out/sums-sft", Selection(min_reward=1.0))
    result = export_sft(["runs/r1"], "out/sums-sft", push="org/sums-sft", hub="hf")   # also on a hub
    datasets.load_dataset("out/sums-sft", split="train")        # messages, tools, env, task_id, reward, ...

Each selected row (hubgym.score.select: the same rules as the trainer's `offline.select`) becomes one
example: `messages`, the prompt then the completion as chat messages in the OpenAI form chat templates read
(assistant `tool_calls` as {id, type: function, function: {name, arguments}}, tool results as role `tool`
with their `tool_call_id`, a reply's reasoning as `reasoning_content`); `tools`, the JSON of the tools the
row was offered (what SFTTrainer passes to the chat template), else null; and where it came from: env,
task_id, rollout_id, run_id, reward, model, source and source_revision (a hub source's commit). The
folder is laid out as a hub dataset repo (data/train-*.parquet and a README.md card naming the source
rollouts and the selection), written beside its final place and moved there whole.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from hubgym.schemas.messages import to_openai
from hubgym.score.select import Selection, SelectionPlan, plan_selection

ROWS_PER_FILE = 100_000


def sft_features():
    """The export's `datasets` features (made when used: `datasets` is slow to import)."""
    import datasets

    string = datasets.Value("string")
    call = {"id": string, "type": string, "function": {"name": string, "arguments": string}}
    message = {"role": string, "content": string, "reasoning_content": string, "tool_calls": datasets.List(call),
               "tool_call_id": string, "name": string}
    return datasets.Features({"messages": datasets.List(message), "tools": string, "env": string, "task_id": string,
                              "rollout_id": string, "run_id": string, "reward": datasets.Value("float64"),
                              "model": string, "source": string, "source_revision": string})


@dataclass
class SftExport:
    out: Path
    rows: int
    plan: SelectionPlan
    files: list[str]
    pushed: str | None = None  # org/name@<commit> when pushed


def export_sft(sources: list[str], out: str | Path, selection: Selection | None = None, *, choice=None,
               push: str | None = None, hub=None, trust: bool = False, pins: dict[str, str] | None = None,
               progress=None) -> SftExport:
    """Select rows of `sources` (re-scored first with a VerifierChoice `choice`), write them as a fine-tuning
    dataset in `out` and, with `push`, commit that folder to the hub repo `push`."""
    selection = selection or Selection()
    plan = plan_selection(list(sources), selection, hub=hub, choice=choice, trust=trust, pins=pins)
    plan.check_not_empty()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        files = _write(_examples(plan, hub, progress), staged / "data")
        (staged / "README.md").write_text(render_sft_card(plan, files, choice, name=push or str(out)))
        from hubgym.files import replace_dir

        replace_dir(staged, out)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    result = SftExport(out, len(plan.kept), plan, files)
    if push:
        result.pushed = push_folder(out, push, hub=hub, message=f"Export {len(plan.kept)} rollouts for SFT")
    return result


def _examples(plan: SelectionPlan, hub, progress) -> Iterator[dict[str, Any]]:
    from hubgym.hub.rollout_reader import iter_rollouts

    tools = _ToolSchemas()
    for source in plan.sources:
        revision = source_revision(source, hub)
        for row in iter_rollouts([source], hub=hub):
            if not plan.keeps(row["rollout_id"]):
                continue
            row = plan.row(row)
            yield {"messages": [chat_message(m) for m in (row["prompt"] or []) + (row["completion"] or [])],
                   "tools": tools.of(row), "env": row["env"], "task_id": row["task_id"],
                   "rollout_id": row["rollout_id"], "run_id": row["run_id"], "reward": row["reward"],
                   "model": (row.get("provenance") or {}).get("model"), "source": source,
                   "source_revision": revision}
            if progress is not None:
                progress(1, len(plan.kept))


def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """A stored hubgym message in the OpenAI chat form templates and TRL read (a reply's reasoning, when a reasoning
    parser split it off, as `reasoning_content`: the name reasoning models' chat templates read)."""
    out = to_openai(message)
    if message.get("reasoning") is not None:
        out["reasoning_content"] = message["reasoning"]
    return out


class _ToolSchemas:
    """The JSON of the tools a row was offered, from the tools its registered env has (stored data never chooses
    code: an env that is not registered here has no tools to describe, and its rows say so)."""

    def __init__(self):
        self.known: dict[tuple[str, tuple[str, ...]], str | None] = {}

    def of(self, row: dict[str, Any]) -> str | None:
        names = tuple((row.get("interaction") or {}).get("tools") or ())
        if not names:
            return None
        key = (row["env"], names)
        if key not in self.known:
            self.known[key] = self._schemas(row, list(names))
        return self.known[key]

    @staticmethod
    def _schemas(row: dict[str, Any], names: list[str]) -> str:
        from hubgym.envs.stored import stored_env_verifier
        from hubgym.tools.modules import NO_TOOLS
        from hubgym.tools.registry import make_toolbox

        own = stored_env_verifier(row["env"]).tools or NO_TOOLS
        task = {"id": row["task_id"], "env": row["env"], "prompt": row["prompt"], "info": row["info"],
                "interaction": row["interaction"]}
        return json.dumps(make_toolbox(names, task, own).schemas(), sort_keys=True)


def _write(examples: Iterator[dict[str, Any]], folder: Path) -> list[str]:
    """Parquet files of ROWS_PER_FILE examples at most, with the features `datasets` reads back exactly."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    features = sft_features()
    metadata = {"huggingface": json.dumps({"info": {"features": features.to_dict()}})}  # how datasets decodes them
    schema = features.arrow_schema.with_metadata(metadata)
    folder.mkdir(parents=True)
    parts: list[list[dict]] = [[]]
    for example in examples:
        if len(parts[-1]) == ROWS_PER_FILE:
            parts.append([])
        parts[-1].append(example)
    names = [f"train-{i:05d}-of-{len(parts):05d}.parquet" for i in range(len(parts))]
    for name, rows in zip(names, parts):
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / name)
    return [f"data/{name}" for name in names]


def source_revision(source: str, hub) -> str | None:
    """The commit a hub source resolves to (what the export read); None for local folders and files."""
    if Path(source).exists():
        return None
    from hubgym.hub.factory import get_hub
    from hubgym.hub.rollout_reader import INDEX_FILE, parse_rollout_ref

    repo, revision, run = parse_rollout_ref(source)
    return get_hub(hub).resolve(repo, revision, patterns=[f"{run or '*'}/{INDEX_FILE}"]).revision


def render_sft_card(plan: SelectionPlan, files: list[str], choice=None, name: str = ".") -> str:
    """The dataset card: `configs:` for load_dataset, then what the rows are, where they came from, how chosen."""
    import yaml

    front = {"configs": [{"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*"}]}],
             "tags": ["hubgym", "sft", "rollouts"]}
    dropped = "\n".join(f"| dropped: {key.removeprefix('dropped/')} | {value} |"
                        for key, value in sorted(plan.counts.items()) if key.startswith("dropped/") and value)
    rescored = ""
    if choice is not None:
        used = ", ".join(f"{env}: {spec.module} (sha256 {spec.sha256[:12]}, {spec.origin})"
                         for env, spec in sorted(choice.specs.items()))
        rescored = f"\nRewards were re-scored before selecting, by {used}; {plan.changed} of them changed.\n"
    sources = "\n".join(f"- `{s}`" for s in plan.sources)
    return f"""---
{yaml.safe_dump(front, sort_keys=False)}---

# Rollouts for fine-tuning

{len(plan.kept)} stored rollouts exported by `hubgym export sft`, in the conversational `messages` form that
TRL's `SFTTrainer` takes (tool calls and tool results in the chat format's own fields; `tools` holds the tool
schemas a row was offered).

## Source rollouts

{sources}

## Selection

`{plan.selection.describe()}`
{rescored}
| rows | count |
| --- | --- |
| read | {plan.counts['read']} |
{dropped}
| kept | {len(plan.kept)} |

## Usage

```python
from datasets import load_dataset
from trl import SFTConfig, SFTTrainer

dataset = load_dataset("{name}", split="train")
trainer = SFTTrainer(model="<a model id or folder>", train_dataset=dataset, args=SFTConfig(output_dir="sft"))
```

Files: {', '.join(files)}.
"""


def push_folder(folder: Path, repo: str, *, hub=None, message: str) -> str:
    """Commit every file of `folder` to the hub dataset repo `repo` (replacing what it held); `repo@<commit>`."""
    from hubgym.hub.factory import get_hub

    backend = get_hub(hub)
    backend.create_repo(repo)
    files = {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file()}
    revision = backend.commit(repo, files, message, replace=True)
    return f"{repo}@{revision}"
