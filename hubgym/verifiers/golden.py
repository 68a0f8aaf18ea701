"""Golden cases: hand-written trajectories with the reward they must earn.

One JSON object per line of a `.jsonl` file:

    {"name": "correct", "task": {"info": {...}, "prompt": [...], "interaction": {...}},
     "completion": [messages...], "reward": 1.0}

`prompt` and `interaction` are optional (a single user message and a single_turn spec). For
multi_turn environments give `"actions": ["...", ...]` instead of `completion`: the checker
replays them through `reset`/`step` and scores the resulting trajectory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hubgym.errors import EnvContractError, Where
from hubgym.schemas.messages import Message, normalize, user
from hubgym.schemas.tasks import Task, interaction, make_task


@dataclass(frozen=True)
class GoldenCase:
    name: str
    task: Task
    reward: float
    completion: list[Message] | None = None
    actions: list[str] | None = None


def load_golden(path: Path, env: str) -> list[GoldenCase]:
    """Read golden cases; a malformed line raises with the file, line and field."""
    if not path.is_file():
        raise EnvContractError(f"golden case file {path.name!r} not found", Where(env=env, field="GOLDEN"),
                               "write golden cases (JSONL) next to the builder and point GOLDEN at them")
    cases = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            cases.append(_parse_case(line, env, f"{path.name}:{number}"))
    return cases


def _parse_case(line: str, env: str, where_text: str) -> GoldenCase:
    try:
        raw: dict[str, Any] = json.loads(line)
        spec = raw["task"]
        task = make_task(env, spec.get("prompt") or [user("(golden case)")], spec["info"],
                         interaction(**spec["interaction"]) if "interaction" in spec else None)
        completion = [normalize(m) for m in raw["completion"]] if "completion" in raw else None
        if (completion is None) == ("actions" not in raw):
            raise KeyError("completion' or 'actions (exactly one)")
        return GoldenCase(raw["name"], task, float(raw["reward"]), completion, raw.get("actions"))
    except (KeyError, TypeError, ValueError) as exc:
        raise EnvContractError(f"golden case {where_text} is malformed: {exc!r}", Where(env=env, field=where_text),
                               "each line needs name, task.info, reward, and completion or actions") from None
