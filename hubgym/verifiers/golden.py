"""Golden cases: hand-written trajectories with the reward they must earn.

One JSON object per line of a `.jsonl` file:

    {"name": "correct", "task": {"info": {...}, "prompt": [...], "interaction": {...}},
     "completion": [messages...], "reward": 1.0}

`prompt` is optional (a single user message). `interaction` is optional for single_turn and
tool_use cases (a single_turn spec); a case of a multi_turn environment, and any case that gives
actions, must state it (`{"kind": "multi_turn", "max_turns": N}`), as the env's own rows do: the
rollout loop ends an episode after `max_turns` replies. For multi_turn environments give
`"actions": ["...", ...]` instead of `completion`: the checker replays them through `reset`/`step`
and scores the resulting trajectory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
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


def load_golden(path: Path, env: str, kind: str | None = None) -> list[GoldenCase]:
    """Read golden cases; a malformed line raises with the file, line, case and field.

    `kind` is the env's interaction kind (TaskBuilder.KIND): a multi_turn env's cases must give `interaction`.
    """
    if not path.is_file():
        raise EnvContractError(f"golden case file {path.name!r} not found", Where(env=env, field="GOLDEN"),
                               "write golden cases (JSONL) next to the builder and point GOLDEN at them")
    cases = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            cases.append(_parse_case(line, env, f"{path.name}:{number}", kind))
    return cases


def _parse_case(line: str, env: str, where_text: str, kind: str | None) -> GoldenCase:
    try:
        raw: dict[str, Any] = json.loads(line)
        spec = raw["task"]
        task = make_task(env, spec.get("prompt") or [user("(golden case)")], spec["info"],
                         interaction(**spec["interaction"]) if "interaction" in spec else None)
        completion = [normalize(m) for m in raw["completion"]] if "completion" in raw else None
        if (completion is None) == ("actions" not in raw):
            raise KeyError("completion' or 'actions (exactly one)")
        case = GoldenCase(raw["name"], task, float(raw["reward"]), completion, raw.get("actions"))
    except (KeyError, TypeError, ValueError) as exc:
        raise EnvContractError(f"golden case {where_text} is malformed: {exc!r}", Where(env=env, field=where_text),
                               "each line needs name, task.info, reward, and completion or actions") from None
    _check_interaction(case, kind, env, where_text, "interaction" in spec)
    return case


def _check_interaction(case: GoldenCase, kind: str | None, env: str, where_text: str, given: bool) -> None:
    """A multi_turn case states its interaction spec, and its actions fit in it (never a silent single_turn)."""
    spec, example = case.task["interaction"], '"interaction": {"kind": "multi_turn", "max_turns": N}'
    where = Where(env=env, field=f"{where_text} task.interaction")
    if not given and (kind == "multi_turn" or case.actions is not None):
        reason = "gives actions" if case.actions is not None else "belongs to a multi_turn env"
        raise EnvContractError(f"golden case {case.name!r} ({where_text}) {reason} but has no task.interaction, so it "
                               f"would run as a single_turn task with max_turns 1", where,
                               f"add {example} to the case's task, with the env's max_turns")
    if case.actions is None:
        return
    if spec["kind"] != "multi_turn":
        raise EnvContractError(f"golden case {case.name!r} ({where_text}) gives actions, but its task.interaction.kind "
                               f"is {spec['kind']!r}", replace(where, field=f"{where_text} task.interaction.kind"),
                               "set kind to 'multi_turn', or give a completion (a list of messages) instead")
    if len(case.actions) > spec["max_turns"]:
        raise EnvContractError(f"golden case {case.name!r} ({where_text}) gives {len(case.actions)} actions, but its "
                               f"task.interaction.max_turns is {spec['max_turns']}: the rollout loop would end the "
                               f"episode after {spec['max_turns']}",
                               replace(where, field=f"{where_text} task.interaction.max_turns"),
                               "raise max_turns to the env's own value, or drop the actions past it")
