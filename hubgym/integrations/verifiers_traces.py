"""Reading what verifiers 0.4 wrote (`traces.jsonl`) as strictly as hubgym reads its own shards.

    path = traces_file(Path("outputs/my-run"))        # the file: regular, at most MAX_FILE_BYTES
    for trace, where in iter_traces(path.read_bytes(), path): ...   # where = "FILE:LINE traces[i]"
    task = task_of(trace, where); prompt, completion, nodes = messages_of(trace, where, task)

A traces file is data from someone else: every field the import uses is checked for its JSON type where it is
read (a number is never a string, a boolean never a number, nothing is coerced), sizes are bounded (a line, a
trace's text), and anything else is one ResultsError naming the file, the line, the field and what it must be.
Nothing here writes; the rows the import makes are then held to the row contract before the writer sees them.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import stat
from pathlib import Path
from typing import Any, Iterator

from hubgym.errors import ResultsError
from hubgym.schemas.messages import ROLES, Message, message, tool_call

TRACES_FILE = "traces.jsonl"
MAX_FILE_BYTES = 1 << 30
"""1 GiB: the file is read whole (its sha256 names the run); a larger results folder is imported in parts."""
MAX_LINE_BYTES = 64 << 20
"""64 MiB: one episode line; a row must fit one shard (the writer's max_bytes is 64 MiB)."""
MAX_TRACE_CHARS = 1 << 22
"""4 Mi characters of message text a trace (about a million tokens: past any context hubgym trains on); more is
refused before anything is tokenized, since re-deriving its tokens and logprobs would never finish."""
LATEST_START = 253402300799.0  # 9999-12-31T23:59:59Z: the last second a Python datetime holds


def traces_file(results: Path) -> Path:
    """The traces file of a vf-eval run folder (or the file itself): a regular file of at most MAX_FILE_BYTES."""
    path = results / TRACES_FILE if results.is_dir() else results
    try:
        info = path.stat()
    except OSError:
        info = None
    if info is None or not stat.S_ISREG(info.st_mode):
        raise ResultsError(f"{results} holds no {TRACES_FILE}; give the run folder vf-eval wrote (its --output-dir "
                           f"and run name) or its {TRACES_FILE}", path=str(results))
    if info.st_size > MAX_FILE_BYTES:
        raise ResultsError(f"{path} is {info.st_size:,} bytes; hubgym imports at most {MAX_FILE_BYTES:,} at once: "
                           f"split the file by lines and import each part to its own --out", path=str(path))
    return path


def iter_traces(data: bytes, path: Path) -> Iterator[tuple[dict, str]]:
    """Each trace of each episode line, with where it is (`file:line traces[i]`); ResultsError when there is none."""
    found = 0
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        if len(line) > MAX_LINE_BYTES:
            raise ResultsError(f"{where} is {len(line):,} bytes; an episode line holds at most {MAX_LINE_BYTES:,} "
                               f"(a row must fit one shard)", path=str(path), line=number)
        try:
            episode = json.loads(line)
        except (ValueError, RecursionError) as exc:  # not UTF-8 or not JSON; nested past Python's recursion limit
            raise ResultsError(f"{where} is not JSON hubgym reads ({type(exc).__name__}: {str(exc)[:120]}); the "
                               f"file was cut or is not vf-eval's output", path=str(path), line=number) from None
        traces = field(episode, "traces", list, where)
        for i, trace in enumerate(traces):
            found += 1
            yield checked(trace, dict, f"{where} traces[{i}]"), f"{where} traces[{i}]"
    if not found:
        raise ResultsError(f"{path} holds no traces (no episode line with a trace): an empty or cut results file; "
                           f"import the run folder vf-eval wrote once it finished", path=str(path))


# -- fields ------------------------------------------------------------------------------------------------------

_KIND_NAMES = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number",
               bool: "a boolean", type(None): "null"}


def field(obj: Any, name: str, kind: type | tuple[type, ...], where: str) -> Any:
    """obj[name], which must be there and of `kind`."""
    if not isinstance(obj, dict) or name not in obj:
        raise ResultsError(f"{where} has no field {name!r}; it is not a verifiers 0.4 trace", path=where)
    return checked(obj[name], kind, f"{where} {name}")


def optional(obj: dict, name: str, kind: type | tuple[type, ...], where: str, default: Any = None) -> Any:
    """obj[name] when it is there and not null (then of `kind`), else `default`."""
    value = obj.get(name)
    return default if value is None else checked(value, kind, f"{where} {name}")


def checked(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    """`value` when it has JSON type `kind` (a boolean is no number; an integer is a number)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and int not in kinds:
        kinds = (*kinds, int)
    if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
        names = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds if not (k is int and float in kinds))
        raise ResultsError(f"{where} is {_KIND_NAMES.get(type(value), type(value).__name__)}, not {names}", path=where)
    return value


def number(value: Any, where: str) -> float:
    """A finite JSON number (JSON's 1e400 is read as infinity: refused)."""
    value = checked(value, float, where)
    if not math.isfinite(value):
        raise ResultsError(f"{where} is {value!r}, not a finite number", path=where)
    return float(value)


# -- the parts of a trace ----------------------------------------------------------------------------------------


def task_of(trace: dict, where: str) -> dict[str, Any]:
    """The hubgym task row the trace answered (`task.data.hubgym_task`, written by the hubgym taskset)."""
    data = field(field(trace, "task", dict, where), "data", dict, f"{where} task")
    raw = data.get("hubgym_task")
    if not isinstance(raw, str):
        raise ResultsError(f"{where} task.data has no hubgym_task: the trace is not of a hubgym env; only runs of "
                           f"`vf-eval hubgym_verifiers` import", path=where)
    try:
        task = json.loads(raw)
    except (ValueError, RecursionError):
        raise ResultsError(f"{where} task.data.hubgym_task is not JSON hubgym reads", path=where) from None
    at = f"{where} task.data.hubgym_task"
    for name, kind in (("id", str), ("env", str), ("info", dict), ("interaction", dict), ("prompt", list)):
        field(task, name, kind, at)
    return task


def messages_of(trace: dict, where: str, task: dict) -> tuple[list[Message], list[Message], list[dict]]:
    """(prompt, completion, the nodes of the path) along the graph's last branch: from its last node up the parents.
    A trace with no node (the episode failed before a turn) has the task's prompt and no completion."""
    nodes = field(trace, "nodes", list, where)
    if not nodes:
        return [_message(m, f"{where} task.data.hubgym_task prompt[{i}]") for i, m in enumerate(task["prompt"])], [], []
    path, at, seen = [], len(nodes) - 1, set()
    while at is not None:
        if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < len(nodes) or at in seen:
            raise ResultsError(f"{where} nodes: parent {at!r} is not an earlier node", path=where)
        seen.add(at)
        node = checked(nodes[at], dict, f"{where} nodes[{at}]")
        path.append(node)
        at = node.get("parent")
    path.reverse()
    first = next((i for i, n in enumerate(path) if sampled(n, f"{where} nodes")), len(path))
    messages = [_message(field(n, "message", dict, f"{where} nodes"), f"{where} nodes") for n in path]
    text = sum(len(m["content"] or "") + sum(len(c["arguments"]) for c in m["tool_calls"] or []) for m in messages)
    if text > MAX_TRACE_CHARS:
        raise ResultsError(f"{where} holds {text:,} characters of message text; a trace holds at most "
                           f"{MAX_TRACE_CHARS:,} (about a million tokens, past any context hubgym trains on)",
                           path=where)
    if not messages[:first]:
        raise ResultsError(f"{where} nodes: the first message is a sampled one; a trace starts with its prompt",
                           path=where)
    return messages[:first], messages[first:], path


def _message(m: Any, where: str) -> Message:
    m = checked(m, dict, f"{where} message")
    role = m.get("role")
    if role not in ROLES:
        raise ResultsError(f"{where} a message has role {role!r:.60}; roles are {', '.join(ROLES)}", path=where)
    calls = [tool_call(checked(c.get("id") or "", str, f"{where} tool_calls[{i}].id"),
                       checked(c.get("name") or "", str, f"{where} tool_calls[{i}].name"),
                       checked(c.get("arguments") or "", str, f"{where} tool_calls[{i}].arguments"))
             for i, c in enumerate(checked(c, dict, f"{where} tool_calls[{i}]")
                                   for i, c in enumerate(optional(m, "tool_calls", list, where, [])))]
    return message(role, _text(m.get("content"), where), tool_calls=calls or None,
                   tool_call_id=optional(m, "tool_call_id", str, where), name=optional(m, "name", str, where))


def _text(content: Any, where: str) -> str:
    """A message's text: a string, or the text parts of a list of parts (null is no text)."""
    if content is None:
        return ""
    if isinstance(content, list):
        parts = [checked(p, dict, f"{where} content[{i}]") for i, p in enumerate(content)]
        return "".join(checked(p.get("text", ""), str, f"{where} content[{i}].text") for i, p in enumerate(parts))
    return checked(content, str, f"{where} content")


def rewards_of(trace: dict, where: str) -> tuple[float | None, list[dict], dict | None]:
    """(reward, reward/<name> metrics, error): the weighted total of the recorded rewards; a failed episode or a
    verifier error recorded by the hubgym env is the row's error, and its reward stays None."""
    info = optional(trace, "info", dict, where, {})
    metrics, total = [], 0.0
    for name, reward in optional(trace, "rewards", dict, where, {}).items():
        if reward is None:
            continue
        at = f"{where} rewards.{name!r:.60}"
        score = number(field(reward, "score", float, at), f"{at}.score")
        weight = number(reward.get("weight", 1.0), f"{at}.weight")
        metrics.append({"name": f"reward/{name}", "value": score})
        total += score * weight
    if not math.isfinite(total):
        raise ResultsError(f"{where} rewards add up to {total}, not a finite number", path=where)
    recorded = optional(trace, "errors", list, where, [])
    errors = [checked(e, dict, f"{where} errors[{i}]") for i, e in enumerate(recorded)]
    failed = optional(info, "hubgym_error", dict, f"{where} info")
    if failed is not None:
        return None, metrics, {"boundary": "verifier", "type": _short(failed.get("type")),
                               "message": _short(failed.get("message"))}
    if not optional(trace, "ok", bool, where, True) or errors:
        e = errors[0] if errors else {}
        return None, metrics, {"boundary": "env", "type": _short(e.get("type", "Error")),
                               "message": _short(e.get("message", "the episode did not complete"))}
    return total, metrics, None


def _short(value: Any, limit: int = 2000) -> str:
    """A recorded error's type or message as text, cut to `limit` characters."""
    text = value if isinstance(value, str) else json.dumps(value)[:limit]
    return text[:limit]


def stored_tokens(nodes: list[dict], where: str) -> tuple[list[int], list[int], list[int], list[float]] | None:
    """The token record the trace holds (every node's ids, mask and logprobs along the path), or None when it has
    none (an eval client that returns no ids). Ids are integers, masks booleans or 0/1, logprobs numbers or null."""
    if not any(n.get("token_ids") for n in nodes):
        return None
    first = next((i for i, n in enumerate(nodes) if sampled(n, f"{where} nodes[{i}]")), len(nodes))
    prompt = [t for i, n in enumerate(nodes[:first]) for t in _ints(n, "token_ids", f"{where} nodes[{i}]")]
    ids, mask, logprobs = [], [], []
    for i, n in enumerate(nodes[first:], start=first):
        at = f"{where} nodes[{i}]"
        tokens = _ints(n, "token_ids", at)
        flags = [int(checked(f, (bool, int), f"{at} mask")) for f in optional(n, "mask", list, at, [])]
        if any(f not in (0, 1) for f in flags):
            raise ResultsError(f"{at} mask holds a value other than true/false (or 1/0)", path=at)
        lps = optional(n, "logprobs", list, at, [])
        ids += tokens
        mask += flags[:len(tokens)] + [0] * (len(tokens) - len(flags))
        logprobs += [0.0 if x is None else number(x, f"{at} logprobs") for x in lps[:len(tokens)]] if lps else []
    return prompt, ids, mask, logprobs if len(logprobs) == len(ids) else []


def sampled(node: dict, where: str) -> bool:
    """Whether the model sampled this node's message (verifiers marks its replies)."""
    return optional(node, "sampled", bool, where, False)


def _ints(node: dict, name: str, where: str) -> list[int]:
    values = optional(node, name, list, where, [])
    return [checked(v, int, f"{where} {name}[{i}]") for i, v in enumerate(values)]


def created_at(trace: dict, where: str) -> dt.datetime:
    """When the episode started (`timing.start`, seconds since 1970): stored as the row's created_at."""
    timing = field(trace, "timing", dict, where)
    start = number(field(timing, "start", float, f"{where} timing"), f"{where} timing.start")
    if not 0 < start <= LATEST_START:
        raise ResultsError(f"{where} timing.start is {start!r}, not a time between 1970 and the year 9999 (seconds "
                           f"since 1970-01-01)", path=where)
    return dt.datetime.fromtimestamp(start, dt.timezone.utc)


def calls_of(trace: dict, where: str) -> list[dict]:
    """The trace's model calls (each an object)."""
    return [checked(c, dict, f"{where} calls[{i}]") for i, c in enumerate(optional(trace, "calls", list, where, []))]
