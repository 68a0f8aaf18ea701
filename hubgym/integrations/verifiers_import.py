"""What verifiers 0.4 wrote (`vf-eval`'s run folder: `traces.jsonl`) as a hubgym run that `report`, `score`, `view`
and `train` read. Needs no verifiers: the file is read as JSON, every field checked where it is used.

    hubgym import verifiers outputs/my-run --out runs/imported --model tiny

One row per trace. The task row comes back from `task.data.hubgym_task` (written by `hubgym_verifiers`, the hubgym
taskset); the messages from the trace's message graph (the path to its last node: the prompt up to the first
sampled message, the completion from there); the reward and its components from the trace's recorded rewards (the
weighted total is verifiers' own reward). What a trace lacks is re-derived, never invented, and flagged on the row:

- token ids (a trace has them only from a token-returning client): the model's chat template renders the prompt and
  the turns between replies, each reply is its text tokenized plus the turn's stop token (metric
  `import/token_ids_rederived` = 1, provenance `engine_version` says so);
- logprobs: a forward pass of `model` over the ids (metric `import/logprobs_rederived` = 1); only where `model` is
  the model that sampled the traces are they behaviour logprobs. With `logprobs=False` they stay empty and the
  trainer leaves such rows out, saying why.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from hubgym.errors import ResultsError
from hubgym.schemas.messages import Message, message, tool_call
from hubgym.schemas.version import SCHEMA_VERSION

TRACES_FILE = "traces.jsonl"
ENGINE = "verifiers"


@dataclass
class ImportSummary:
    out: Path
    run_id: str
    rows: int
    envs: dict[str, int]
    rederived_tokens: int  # rows whose token ids were re-derived
    rederived_logprobs: int


def import_verifiers(results: str | Path, out: str | Path, *, model: str, logprobs: bool = True,
                     progress: Callable[[int], None] | None = None) -> ImportSummary:
    """Write a hubgym run folder at `out` from a vf-eval run folder (or its traces.jsonl); `model` (`tiny`, a folder,
    a Hub id) gives the tokenizer and chat template that re-derive missing token ids, and the weights that re-derive
    missing logprobs. A bad line is one ResultsError naming the file, line and field; nothing is written then."""
    from hubgym.rollout.writer import ShardWriter, worker_name

    path = _traces_file(Path(results))
    data = path.read_bytes()
    run_id = "vf-" + hashlib.sha256(data).hexdigest()[:12]  # re-importing the same results writes the same run
    deriver = Deriver(model, logprobs)
    rows = [deriver.row(trace, run_id, where) for trace, where in _traces(data, path)]
    _number_samples(rows, run_id)
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    with ShardWriter(out, worker_name(0, 1), run_id=run_id) as writer:
        done = writer.existing_ids()
        for group in groups.values():
            writer.add_group([r for r in group if r["rollout_id"] not in done])
            if progress is not None:
                progress(len(group))
        writer.flush()
        writer.write_manifest(_manifest(run_id, rows, deriver, writer, path))
    envs: dict[str, int] = {}
    for row in rows:
        envs[row["env"]] = envs.get(row["env"], 0) + 1
    return ImportSummary(Path(out), run_id, len(rows), envs, sum(_flag(r, "token_ids") for r in rows),
                         sum(_flag(r, "logprobs") for r in rows))


def _traces_file(results: Path) -> Path:
    path = results / TRACES_FILE if results.is_dir() else results
    if not path.is_file():
        raise ResultsError(f"{results} holds no {TRACES_FILE}; give the run folder vf-eval wrote (its --output-dir "
                           f"and run name) or its {TRACES_FILE}", path=str(results))
    return path


def _traces(data: bytes, path: Path) -> Iterator[tuple[dict, str]]:
    """Each trace of each episode line, with where it is (`file:line`)."""
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            episode = json.loads(line)
        except ValueError as exc:
            raise ResultsError(f"{where} is not JSON ({exc}); the file was cut or is not vf-eval's output",
                               path=str(path), line=number) from None
        traces = _field(episode, "traces", list, where)
        for i, trace in enumerate(traces):
            yield _checked(trace, dict, f"{where} traces[{i}]"), f"{where} traces[{i}]"


def _field(obj: Any, name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or name not in obj:
        raise ResultsError(f"{where} has no field {name!r}; it is not a verifiers 0.4 trace", path=where)
    return _checked(obj[name], kind, f"{where} {name}")


def _checked(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool) and kind in (int, float, (int, float)):
        names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ResultsError(f"{where} is {type(value).__name__}, not {names}", path=where)
    return value


def _flag(row: dict, what: str) -> bool:
    return any(m["name"] == f"import/{what}_rederived" and m["value"] == 1.0 for m in row["metrics"])


def _number_samples(rows: list[dict], run_id: str) -> None:
    """Samples of one task are numbered in file order: a group is a task's traces, as `-r N` made them."""
    seen: dict[str, int] = {}
    for row in rows:
        row["sample"] = seen.get(row["group"], 0)
        seen[row["group"]] = row["sample"] + 1
        row["rollout_id"] = f"{run_id}-{row['task_id']}-{row['sample']}"


class Deriver:
    """Turns traces into rows, re-deriving token records with one model's tokenizer (and weights, for logprobs)."""

    def __init__(self, model: str, logprobs: bool):
        self.model_name, self.logprobs = model, logprobs
        self._renderer = None
        self._model = None

    @property
    def renderer(self):
        if self._renderer is None:
            from transformers import AutoTokenizer

            from hubgym.models import resolve_model
            from hubgym.rollout.tokens import ChatRenderer

            folder = resolve_model(self.model_name, setting="--model",
                                   needs=("tokenizer.json", "tokenizer_config.json"))
            self._renderer = ChatRenderer(AutoTokenizer.from_pretrained(folder))
        return self._renderer

    def row(self, trace: dict, run_id: str, where: str) -> dict[str, Any]:
        task = _task(trace, where)
        prompt, completion, nodes = _messages(trace, where)
        info = trace.get("info") if isinstance(trace.get("info"), dict) else {}
        final = info.get("hubgym_final_observation")
        if isinstance(final, str) and final and completion and completion[-1]["role"] == "assistant":
            completion.append(message("user", final))  # the episode's last observation, as hubgym's loop keeps it
        reward, metrics, error = _rewards(trace, where)
        calls = [c for c in trace.get("calls") or [] if isinstance(c, dict)]
        finish = next((c.get("finish_reason") for c in reversed(calls) if c.get("finish_reason")), None)
        row: dict[str, Any] = {
            "rollout_id": "", "run_id": run_id, "task_id": task["id"], "env": task["env"],
            "group": f"{run_id}-{task['id']}", "sample": 0, "prompt": prompt, "completion": completion,
            "info": task["info"], "interaction": task["interaction"], "tokens_consistent": True,
            "reward": reward, "finish_reason": finish if isinstance(finish, str) else None,
            "truncated": finish == "length", "num_turns": sum(1 for m in completion if m["role"] == "assistant"),
            "error": error, "timings": {"generate_s": None, "tools_s": None, "score_s": None, "total_s": None},
            "created_at": _created_at(trace),
        }
        stored = _stored_tokens(nodes)
        if stored is None:
            self._rederive_tokens(row, task)
        else:
            row["prompt_ids"], row["completion_ids"], row["completion_mask"], row["completion_logprobs"] = stored
        rederived_logprobs = False
        if len(row["completion_logprobs"]) != len(row["completion_ids"]):
            row["completion_logprobs"], rederived_logprobs = self._logprobs(row), self.logprobs
        metrics += [{"name": "import/token_ids_rederived", "value": float(stored is None)},
                    {"name": "import/logprobs_rederived", "value": float(rederived_logprobs)}]
        row["metrics"] = metrics
        row["provenance"] = self._provenance(trace, calls, stored is None, rederived_logprobs)
        return row

    def _rederive_tokens(self, row: dict, task: dict) -> None:
        """The token record the rollout loop would have kept for these messages: the rendered prompt, each reply's
        text plus the stop token that closes its turn (mask 1), the template's text between replies (mask 0)."""
        from hubgym.rollout.tokens import audit_tokens

        r = self.renderer
        tools = None  # single_turn and multi_turn rows: verifiers' hubgym taskset offers no tools
        row["prompt_ids"] = r.prompt_ids(row["prompt"], tools)
        ids, mask, history = [], [], list(row["prompt"])
        completion = row["completion"]
        for i, m in enumerate(completion):
            if m["role"] != "assistant":
                continue
            last = not any(later["role"] == "assistant" for later in completion[i + 1:])
            stop = "" if last and row["finish_reason"] == "length" else r.closing_stop  # a cut reply has no stop token
            reply = r.encode((m["content"] or "") + stop)
            ids, mask = ids + reply, mask + [1] * len(reply)
            new = []
            for later in completion[i + 1:]:
                if later["role"] == "assistant":
                    break
                new.append(later)
            if not last:  # after the last reply: no tokens
                bridge, problem = r.bridge(history, m, new, tools, ended_with_eos=bool(r.closing_stop))
                ids, mask = ids + bridge, mask + [0] * len(bridge)
                row["tokens_consistent"] = row["tokens_consistent"] and problem is None
            history += [m] + new
        row["completion_ids"], row["completion_mask"], row["completion_logprobs"] = ids, mask, []
        if row["tokens_consistent"]:  # the audit every written row gets (hubgym replay's)
            row["tokens_consistent"] = audit_tokens(row, r, tools).ok

    def _logprobs(self, row: dict) -> list[float]:
        """The model's logprob of each sampled token given everything before it (0 for env tokens), or [] when not
        asked for."""
        if not self.logprobs or not row["completion_ids"]:
            return []
        import torch

        if self._model is None:
            from transformers import AutoModelForCausalLM

            from hubgym.models import resolve_model

            self._model = AutoModelForCausalLM.from_pretrained(resolve_model(self.model_name), dtype=torch.float32)
            self._model.eval()
        ids = torch.tensor([row["prompt_ids"] + row["completion_ids"]])
        with torch.no_grad():
            logits = self._model(input_ids=ids).logits[0, :-1].float()  # (T-1, V): position t predicts token t+1
        picked = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        out = picked[len(row["prompt_ids"]) - 1:].tolist()  # (C,): the completion tokens
        return [lp if keep else 0.0 for lp, keep in zip(out, row["completion_mask"])]

    def _provenance(self, trace: dict, calls: list[dict], tokens: bool, logprobs: bool) -> dict[str, Any]:
        version = trace.get("verifiers", {}).get("version") if isinstance(trace.get("verifiers"), dict) else None
        notes = [f"imported from verifiers {version or '?'}"]
        if tokens:
            notes.append(f"token ids re-derived with {self.model_name}'s chat template")
        if logprobs:
            notes.append(f"logprobs re-derived by {self.model_name}")
        sampled_by = next((c.get("model") for c in calls if isinstance(c.get("model"), str)), None)
        sampling = next((c.get("sampling") for c in calls if isinstance(c.get("sampling"), dict)), {})
        return {"model": sampled_by or self.model_name, "policy_version": 0,
                "sampling": json.dumps(sampling, sort_keys=True), "env_repo": None, "env_revision": None,
                "verifier_module": None, "verifier_sha256": None, "engine": ENGINE, "engine_version": "; ".join(notes),
                "chat_template_sha256": self.renderer.template_sha256 if tokens else None}


def _task(trace: dict, where: str) -> dict[str, Any]:
    data = _field(_field(trace, "task", dict, where), "data", dict, f"{where} task")
    raw = data.get("hubgym_task")
    if not isinstance(raw, str):
        raise ResultsError(f"{where} task.data has no hubgym_task: the trace is not of a hubgym env; only runs of "
                           f"`vf-eval hubgym_verifiers` import", path=where)
    try:
        task = json.loads(raw)
    except ValueError:
        raise ResultsError(f"{where} task.data.hubgym_task is not JSON", path=where) from None
    for name, kind in (("id", str), ("env", str), ("info", dict), ("interaction", dict), ("prompt", list)):
        _field(task, name, kind, f"{where} task.data.hubgym_task")
    return task


def _messages(trace: dict, where: str) -> tuple[list[Message], list[Message], list[dict]]:
    """(prompt, completion, the nodes of the path) along the graph's last branch: from its last node up the parents."""
    nodes = _field(trace, "nodes", list, where)
    path, at, seen = [], (len(nodes) - 1 if nodes else None), set()  # no nodes: the episode failed before a turn
    while at is not None:
        if not isinstance(at, int) or not 0 <= at < len(nodes) or at in seen:
            raise ResultsError(f"{where} nodes: parent {at!r} is not an earlier node", path=where)
        seen.add(at)
        node = _checked(nodes[at], dict, f"{where} nodes[{at}]")
        path.append(node)
        at = node.get("parent")
    path.reverse()
    first = next((i for i, n in enumerate(path) if n.get("sampled")), len(path))
    messages = [_message(_field(n, "message", dict, f"{where} nodes"), where) for n in path]
    return messages[:first], messages[first:], path


def _message(m: dict, where: str) -> Message:
    role = m.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise ResultsError(f"{where} a message has role {role!r}", path=where)
    calls = [tool_call(str(c.get("id") or ""), str(c.get("name") or ""), str(c.get("arguments") or ""))
             for c in m.get("tool_calls") or [] if isinstance(c, dict)]
    return message(role, _text(m.get("content")), tool_calls=calls or None, tool_call_id=m.get("tool_call_id"),
                   name=m.get("name"))


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _rewards(trace: dict, where: str) -> tuple[float | None, list[dict], dict | None]:
    """(reward, reward/<name> metrics, error): the weighted total of the recorded rewards; a failed episode or a
    verifier error recorded by the hubgym env is the row's error, and its reward stays None."""
    info = trace.get("info") if isinstance(trace.get("info"), dict) else {}
    metrics, total = [], 0.0
    for name, reward in (trace.get("rewards") or {}).items():
        if reward is None:
            continue
        score = _checked(_field(reward, "score", (int, float), f"{where} rewards.{name}"), (int, float), where)
        weight = _checked(reward.get("weight", 1.0), (int, float), f"{where} rewards.{name}.weight")
        if not math.isfinite(score) or not math.isfinite(weight):
            raise ResultsError(f"{where} rewards.{name} is not a finite number", path=where)
        metrics.append({"name": f"reward/{name}", "value": float(score)})
        total += score * weight
    errors = [e for e in trace.get("errors") or [] if isinstance(e, dict)]
    if isinstance(info.get("hubgym_error"), dict):
        e = info["hubgym_error"]
        return None, metrics, {"boundary": "verifier", "type": str(e.get("type")), "message": str(e.get("message"))}
    if not trace.get("ok", True) or errors:
        e = errors[0] if errors else {}
        return None, metrics, {"boundary": "env", "type": str(e.get("type", "Error")),
                               "message": str(e.get("message", "the episode did not complete"))[:2000]}
    return total, metrics, None


def _stored_tokens(nodes: list[dict]) -> tuple[list[int], list[int], list[int], list[float]] | None:
    """The token record the trace holds (every node's ids, mask and logprobs along the path), or None when it has
    none (an eval client that returns no ids)."""
    if not any(n.get("token_ids") for n in nodes):
        return None
    first = next((i for i, n in enumerate(nodes) if n.get("sampled")), len(nodes))
    prompt = [int(t) for n in nodes[:first] for t in n.get("token_ids") or []]
    ids, mask, logprobs = [], [], []
    for n in nodes[first:]:
        tokens = [int(t) for t in n.get("token_ids") or []]
        flags = n.get("mask") or [False] * len(tokens)
        lps = n.get("logprobs") or []
        ids += tokens
        mask += [int(bool(f)) for f in flags[:len(tokens)]] + [0] * (len(tokens) - len(flags))
        logprobs += [float(x) if x is not None else 0.0 for x in lps[:len(tokens)]] if lps else []
    return prompt, ids, mask, logprobs if len(logprobs) == len(ids) else []


def _created_at(trace: dict) -> dt.datetime | None:
    start = (trace.get("timing") or {}).get("start") if isinstance(trace.get("timing"), dict) else None
    if isinstance(start, (int, float)) and math.isfinite(start) and start > 0:
        return dt.datetime.fromtimestamp(start, dt.timezone.utc)
    return None


def _manifest(run_id: str, rows: list[dict], deriver: Deriver, writer: Any, source: Path) -> dict[str, Any]:
    envs: dict[str, dict] = {}
    for row in rows:
        entry = envs.setdefault(row["env"], {"config": None, "tasks": 0, "verifier_module": None,
                                             "verifier_sha256": None, "env_repo": None, "env_revision": None})
        entry["tasks"] = len({r["task_id"] for r in rows if r["env"] == row["env"]})
    return {"schema_version": SCHEMA_VERSION, "run_id": run_id, "worker": writer.worker,
            "model": rows[0]["provenance"]["model"] if rows else deriver.model_name, "policy_version": 0,
            "sampling": {}, "engine": ENGINE, "engine_version": rows[0]["provenance"]["engine_version"] if rows else "",
            "chat_template_sha256": rows[0]["provenance"]["chat_template_sha256"] if rows else None,
            "envs": envs, "split": None, "n": max((r["sample"] + 1 for r in rows), default=0),
            "rows": writer.rows_written, "shards": [p.name for p in writer.shards()],
            "shard_files": writer.shard_files(), "imported_from": source.name,
            "updated_at": dt.datetime.now(dt.timezone.utc).isoformat()}
