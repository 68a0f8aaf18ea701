"""A verifiers 0.4 `traces.jsonl` written by hand: the fields `hubgym import verifiers` reads, for the import's
bad-input tests (the real vf-eval run, which needs verifiers' harness, is in test_integration_verifiers.py).

    line = episode(trace(task))                      # one episode line with one trace of a hubgym task
    write_traces(folder, [line, ...])                # folder/traces.jsonl
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

START = 1767225600.0  # 2026-01-01T00:00:00Z: fixed, no test depends on the day it runs


def trace(task: dict[str, Any], reply: str = "<answer>4</answer>", score: float = 1.0) -> dict[str, Any]:
    """A finished single-turn episode of `task`: its prompt, one sampled reply, the reward verifiers recorded."""
    prompt = [{"role": m["role"], "content": m["content"]} for m in task["prompt"]]
    nodes = [{"message": m, "parent": i - 1 if i else None, "sampled": False} for i, m in enumerate(prompt)]
    nodes.append({"message": {"role": "assistant", "content": reply}, "parent": len(prompt) - 1, "sampled": True})
    return {"task": {"data": {"hubgym_task": json.dumps(task), "id": task["id"]}}, "nodes": nodes,
            "rewards": {"correct": {"score": score, "weight": 1.0}}, "errors": [], "ok": True, "info": {},
            "calls": [{"finish_reason": "stop", "model": "m", "sampling": {"temperature": 1.0}}],
            "timing": {"start": START}, "verifiers": {"version": "0.4.0"}}


def episode(*traces: dict[str, Any]) -> dict[str, Any]:
    return {"id": "e", "traces": list(traces)}


def write_traces(folder: Path, lines: list[Any]) -> Path:
    """`folder/traces.jsonl` holding each line (a dict is written as JSON, bytes and str as they are)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = b"\n".join(line if isinstance(line, bytes) else line.encode() if isinstance(line, str)
                      else json.dumps(line).encode() for line in lines) + b"\n"
    (folder / "traces.jsonl").write_bytes(data)
    return folder
