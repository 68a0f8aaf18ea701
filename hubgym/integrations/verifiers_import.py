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
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pyarrow import ArrowException

from hubgym.errors import ResultsError
from hubgym.files import read_small_file
from hubgym.integrations.verifiers_traces import (
    MAX_FILE_BYTES, calls_of, created_at, iter_traces, messages_of, optional, rewards_of, stored_tokens, task_of,
    traces_file,
)
from hubgym.schemas.messages import message
from hubgym.schemas.version import SCHEMA_VERSION

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
    missing logprobs. A bad line is one ResultsError naming the file, line and field (and the rule of the row
    contract a row would break); every row is made and checked before anything is written, and a write that fails
    anyway takes away what it wrote: `out` is left as it was found."""
    path = traces_file(Path(results))
    try:  # read from the descriptor checked to be a regular file of bounded size (not the path again)
        data = read_small_file(path, MAX_FILE_BYTES)
    except ValueError as exc:
        raise ResultsError(f"{path} cannot be read ({exc})", path=str(path)) from None
    run_id = "vf-" + hashlib.sha256(data).hexdigest()[:12]  # re-importing the same results writes the same run
    deriver = Deriver(model, logprobs)
    rows, places = [], []
    for trace, where in iter_traces(data, path):
        rows.append(deriver.row(trace, run_id, where))
        places.append(where)
    _number_samples(rows, run_id)
    for row, where in zip(rows, places):
        _check_row(row, where, deriver.vocab_size)
    _write(Path(out), run_id, rows, _manifest_of(run_id, rows, deriver, path), progress)
    envs: dict[str, int] = {}
    for row in rows:
        envs[row["env"]] = envs.get(row["env"], 0) + 1
    return ImportSummary(Path(out), run_id, len(rows), envs, sum(_flag(r, "token_ids") for r in rows),
                         sum(_flag(r, "logprobs") for r in rows))


def _check_row(row: dict[str, Any], where: str, vocab_size: int) -> None:
    """A row the writer would store and every reader take (the row contract, token ids in the model's vocabulary,
    each value of its column's type), or ResultsError naming where in the file it came from."""
    from hubgym.errors import RowContractError
    from hubgym.rollout.writer import check_rows, rows_table
    from hubgym.schemas.row_contract import row_breach

    breach = row_breach(row, vocab_size=vocab_size)
    if breach is not None:
        raise ResultsError(f"{where} makes a row whose column {breach.column!r} {breach.message()}; hubgym stores "
                           f"only rows every reader takes", path=where)
    try:
        check_rows(rows_table([row]), "the imported row")
    except RowContractError as exc:
        raise ResultsError(f"{where} makes a row that {str(exc).split(': ', 1)[-1]}", path=where) from None
    except (ArrowException, TypeError, ValueError, OverflowError) as exc:
        raise ResultsError(f"{where} makes a row with a value of another type than the rollout schema's "
                           f"({type(exc).__name__}: {str(exc)[:160]})", path=where) from None


def _write(out: Path, run_id: str, rows: list[dict], manifest: Callable[[Any], dict],
           progress: Callable[[int], None] | None) -> None:
    """The rows as a run folder (resumed where one of this run is there); a write that fails takes away the folder
    when this call made it, so a later import into it starts clean."""
    from hubgym.rollout.writer import ShardWriter, worker_name

    made = not out.exists()
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    try:
        with ShardWriter(out, worker_name(0, 1), run_id=run_id) as writer:
            done = writer.existing_ids()
            for group in groups.values():
                writer.add_group([r for r in group if r["rollout_id"] not in done])
                if progress is not None:
                    progress(len(group))
            writer.flush()
            writer.write_manifest(manifest(writer))
    except BaseException:
        if made:
            shutil.rmtree(out, ignore_errors=True)
        raise


def _check_tokens(row: dict[str, Any], where: str, vocab_size: int) -> None:
    """The token record's rules of the row contract (ids in the vocabulary, masks, logprobs), before the ids are
    used: a forward pass over an id past the vocabulary would index nothing."""
    from hubgym.schemas.row_contract import row_breach

    tokens = {k: row[k] for k in ("prompt_ids", "completion_ids", "completion_mask", "completion_logprobs")}
    breach = row_breach(tokens, vocab_size=vocab_size)
    if breach is not None:
        raise ResultsError(f"{where} holds a token record whose column {breach.column!r} {breach.message()}",
                           path=where)


def _context(model: Any) -> int | None:
    """The longest sequence a model takes (its max_position_embeddings), when its config says."""
    value = getattr(model.config, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


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

    @property
    def vocab_size(self) -> int:
        """The token ids the model takes (its tokenizer's)."""
        return len(self.renderer.tokenizer)

    def row(self, trace: dict, run_id: str, where: str) -> dict[str, Any]:
        task = task_of(trace, where)
        prompt, completion, nodes = messages_of(trace, where, task)
        info = optional(trace, "info", dict, where, {})
        final = optional(info, "hubgym_final_observation", str, f"{where} info")
        if final and completion and completion[-1]["role"] == "assistant":
            completion.append(message("user", final))  # the episode's last observation, as hubgym's loop keeps it
        reward, metrics, error = rewards_of(trace, where)
        if not nodes and error is None:
            raise ResultsError(f"{where} nodes is empty (not one message) yet the trace records no failure: an "
                               f"episode without a reply has nothing to score or train on", path=where)
        calls = calls_of(trace, where)
        finish = next((optional(c, "finish_reason", str, f"{where} calls") for c in reversed(calls)
                       if c.get("finish_reason")), None)
        row: dict[str, Any] = {
            "rollout_id": "", "run_id": run_id, "task_id": task["id"], "env": task["env"],
            "group": f"{run_id}-{task['id']}", "sample": 0, "prompt": prompt, "completion": completion,
            "info": task["info"], "interaction": task["interaction"], "tokens_consistent": True,
            "reward": reward, "finish_reason": finish or ("error" if error else ""),  # as hubgym's loop says
            "truncated": finish == "length", "num_turns": sum(1 for m in completion if m["role"] == "assistant"),
            "error": error, "timings": {"generate_s": None, "tools_s": None, "score_s": None, "total_s": None},
            "created_at": created_at(trace, where),
        }
        stored = stored_tokens(nodes, where)
        if stored is None:
            self._rederive_tokens(row, where)
        else:
            row["prompt_ids"], row["completion_ids"], row["completion_mask"], row["completion_logprobs"] = stored
        _check_tokens(row, where, self.vocab_size)  # before a forward pass indexes the model with them
        rederived_logprobs = False
        if len(row["completion_logprobs"]) != len(row["completion_ids"]):
            row["completion_logprobs"], rederived_logprobs = self._logprobs(row, where), self.logprobs
        metrics += [{"name": "import/token_ids_rederived", "value": float(stored is None)},
                    {"name": "import/logprobs_rederived", "value": float(rederived_logprobs)}]
        row["metrics"] = metrics
        row["provenance"] = self._provenance(trace, calls, stored is None, rederived_logprobs, where)
        return row

    def _rederive_tokens(self, row: dict, where: str) -> None:
        """The token record the rollout loop would have kept for these messages (`_tokens`); ResultsError naming the
        trace when the model's chat template cannot render them (its own code: a template error is not ours)."""
        try:
            self._tokens(row)
        except Exception as exc:  # noqa: BLE001 - jinja2's errors, and whatever a template raises
            raise ResultsError(f"{where} cannot be rendered by the chat template of {self.model_name} "
                               f"({type(exc).__name__}: {str(exc)[:160]}); import it with the model that sampled it",
                               path=where) from None

    def _tokens(self, row: dict) -> None:
        """The rendered prompt, each reply's text plus the stop token that closes its turn (mask 1), the template's
        text between replies (mask 0)."""
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

    def _logprobs(self, row: dict, where: str) -> list[float]:
        """The model's logprob of each sampled token given everything before it (0 for env tokens), or [] when not
        asked for; a sequence past the model's context is refused before the forward pass."""
        if not self.logprobs or not row["completion_ids"]:
            return []
        import torch

        if self._model is None:
            from transformers import AutoModelForCausalLM

            from hubgym.models import resolve_model

            self._model = AutoModelForCausalLM.from_pretrained(resolve_model(self.model_name), dtype=torch.float32)
            self._model.eval()
        length, context = len(row["prompt_ids"]) + len(row["completion_ids"]), _context(self._model)
        if context is not None and length > context:
            raise ResultsError(f"{where} is {length:,} tokens, past the context of {self.model_name} ({context:,}): "
                               f"its logprobs cannot be re-derived; import it with --no-logprobs, or with the model "
                               f"that sampled it", path=where)
        ids = torch.tensor([row["prompt_ids"] + row["completion_ids"]])
        with torch.no_grad():
            logits = self._model(input_ids=ids).logits[0, :-1].float()  # (T-1, V): position t predicts token t+1
        picked = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        out = picked[len(row["prompt_ids"]) - 1:].tolist()  # (C,): the completion tokens
        return [lp if keep else 0.0 for lp, keep in zip(out, row["completion_mask"])]

    def _provenance(self, trace: dict, calls: list[dict], tokens: bool, logprobs: bool,
                    where: str) -> dict[str, Any]:
        version = optional(optional(trace, "verifiers", dict, where, {}), "version", str, f"{where} verifiers")
        notes = [f"imported from verifiers {version or '?'}"]
        if tokens:
            notes.append(f"token ids re-derived with {self.model_name}'s chat template")
        if logprobs:
            notes.append(f"logprobs re-derived by {self.model_name}")
        sampled_by = next((optional(c, "model", str, f"{where} calls") for c in calls if c.get("model")), None)
        sampling = next((optional(c, "sampling", dict, f"{where} calls") for c in calls if c.get("sampling")), {})
        return {"model": sampled_by or self.model_name, "policy_version": 0,
                "sampling": json.dumps(sampling, sort_keys=True), "env_repo": None, "env_revision": None,
                "verifier_module": None, "verifier_sha256": None, "engine": ENGINE, "engine_version": "; ".join(notes),
                "chat_template_sha256": self.renderer.template_sha256 if tokens else None}


def _manifest_of(run_id: str, rows: list[dict], deriver: Deriver, source: Path) -> Callable[[Any], dict[str, Any]]:
    return lambda writer: _manifest(run_id, rows, deriver, writer, source)


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
