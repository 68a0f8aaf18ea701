"""The checks `hubgym wrap` runs on a source dataset, and the golden cases it makes from the wrapped env.

    rows = {"train": limit_rows(dataset, spec, "train")}  # the columns the env reads, the first --limit rows
    check_source(rows, spec)                      # column types; no empty prompt or answer; gold answers that fit
    unique, source_rows = dedup(rows["train"], spec)  # a repeated task is kept once
    cases = golden_cases_from_data(folder, spec, {"train": source_rows})  # builds the staged env: every gold
                                                  # answer must earn the top reward; cases from the first rows

Every failure is one EnvContractError naming the env, the source config, the split, the row (its
position in the source split) and the column, with a fix.
"""

from __future__ import annotations

import json
import re
import signal
import string
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import pyarrow as pa

from hubgym.errors import EnvContractError

if TYPE_CHECKING:
    from hubgym.authoring.spec import WrapSpec

LETTERS = string.ascii_uppercase
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")  # the generated numeric verifier's pattern
GSM8K_REGEX = r"####\s*(.+)$"


def check_source(splits: dict[str, datasets.Dataset], spec: "WrapSpec") -> None:
    """Every split: its columns, their Arrow data, then its rows."""
    for split, rows in splits.items():
        check_columns(rows, spec, split)
        check_arrow(rows, spec, split)
        check_values(rows, spec, split)


def check_arrow(rows: datasets.Dataset, spec: "WrapSpec", split: str) -> None:
    """The columns the env reads hold valid Arrow data: a JSON Lines or CSV file that is not UTF-8 loads into
    string columns that are not valid UTF-8 (datasets does not check), and reading a value of them would fail."""
    from hubgym.hub.shard_checks import first_invalid_row

    table = rows.data.table
    for column in columns_of(spec):
        start = 0
        for chunk in table.column(column).chunks:
            try:
                chunk.validate(full=True)
            except pa.ArrowInvalid as exc:
                utf8 = "utf8" in str(exc).lower().replace("-", "")
                what = "text that is not UTF-8" if utf8 else f"data Arrow cannot read ({str(exc).splitlines()[0]:.160})"
                row = f"row {start + first_invalid_row(chunk)}"
                raise EnvContractError(f"the column holds {what}", spec.where(split, row, column),
                                       "save the source files as UTF-8 (e.g. iconv -f latin1 -t utf-8), then wrap "
                                       "again") from None
            start += len(chunk)


def limit_rows(rows: datasets.Dataset, spec: "WrapSpec", split: str) -> datasets.Dataset:
    """The first `--limit` rows, with only the columns the env reads (the rest never reach data/)."""
    check_columns_exist(rows, spec, split)
    if spec.limit is not None and len(rows) > spec.limit:
        rows = rows.select(range(spec.limit))
    return rows.select_columns(columns_of(spec))


def dedup(rows: datasets.Dataset, spec: "WrapSpec") -> tuple[datasets.Dataset, list[int]]:
    """The rows without repeats, and each kept row's source index. A repeat is a row with the same prompt, choices
    and gold answer (as the builder reads it) as an earlier one: it would be the same task, with the same id."""
    pattern = re.compile(spec.answer_regex) if spec.answer_regex else None
    seen: set[str] = set()
    kept = []
    for index, values in enumerate(zip(*(rows[c] for c in columns_of(spec)))):
        key = json.dumps([*values[:-1], gold_of(values[-1], spec, pattern)], default=str)
        if key not in seen:
            seen.add(key)
            kept.append(index)
    return (rows if len(kept) == len(rows) else rows.select(kept)), kept


def gold_of(answer: Any, spec: "WrapSpec", pattern: re.Pattern | None) -> str | None:
    """The gold answer as the generated builder reads it from the answer column; None when the pattern misses."""
    if spec.reward == "choice":
        return LETTERS[answer] if isinstance(answer, int) else str(answer).strip().upper()
    if pattern is None:
        return str(answer).strip()
    match = bounded_search(pattern, str(answer))
    return None if match is None else (match.group(1) if pattern.groups else match.group(0)).strip()


REGEX_LIMIT_S = 2.0
"""Longest one search of --answer-regex may take: microseconds for any regex that does not backtrack."""


class RegexTimeout(Exception):
    """A search of --answer-regex ran past REGEX_LIMIT_S (raised from a timer signal; re checks for signals)."""


def bounded_search(pattern: re.Pattern, text: str) -> re.Match | None:
    """`pattern.search(text)`, stopped after REGEX_LIMIT_S (RegexTimeout): a regex such as `(a+)+$` backtracks
    for hours on a long answer. The limit is a timer signal, so it holds in the main thread (where the CLI runs
    it); elsewhere the search runs unbounded."""
    if threading.current_thread() is not threading.main_thread():
        return pattern.search(text)

    def stop(signum, frame):
        raise RegexTimeout()
    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, REGEX_LIMIT_S)
    try:
        return pattern.search(text)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def local_files_hold_no_rows(dataset: str) -> bool:
    """True when `dataset` is a folder whose data files all hold no rows (a CSV header alone, an empty JSON
    Lines file, a Parquet file of 0 rows)."""
    import pyarrow.parquet as pq

    files = [p for p in Path(dataset).rglob("*") if p.suffix in (".parquet", ".csv", ".json", ".jsonl")]
    if not Path(dataset).is_dir() or not files:
        return False

    def rows_in(path: Path) -> int:
        if path.suffix == ".parquet":
            return pq.read_metadata(path).num_rows
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip() not in ("", "[]")]
        return len(lines) - (path.suffix == ".csv")  # a CSV's first line is its header

    try:
        return all(rows_in(path) <= 0 for path in files)
    except Exception:  # an unreadable file: the caller's "cannot read" error says why
        return False


def columns_of(spec: "WrapSpec") -> list[str]:
    return [spec.prompt, *([spec.choices] if spec.choices else []), spec.answer]


def check_columns_exist(rows: datasets.Dataset, spec: "WrapSpec", split: str | None) -> None:
    for option, column in (("--prompt", spec.prompt), ("--choices", spec.choices), ("--answer", spec.answer)):
        if column is not None and column not in rows.column_names:
            raise EnvContractError(f"the dataset has no column {column!r}; its columns are {rows.column_names}",
                                   spec.where(split, field=column), f"pass {option} with one of {rows.column_names}")


def check_columns(rows: datasets.Dataset, spec: "WrapSpec", split: str) -> None:
    """Column types: text prompts, text or numeric answers (choice: index or letter), lists of text choices."""
    if len(rows) == 0:
        raise EnvContractError(f"split {split!r} of the dataset is empty", spec.where(split),
                               "wrap a dataset with rows, or leave this split out with --split-map")
    schema = rows.data.schema
    _require(rows, spec, split, spec.prompt, _is_text(schema.field(spec.prompt).type), "text (a string)")
    answer = schema.field(spec.answer).type
    if spec.reward == "choice":
        _require(rows, spec, split, spec.answer, pa.types.is_integer(answer) or _is_text(answer),
                 "a 0-based index (an integer) or a letter")
        choices = schema.field(spec.choices).type
        _require(rows, spec, split, spec.choices,
                 (pa.types.is_list(choices) or pa.types.is_large_list(choices)) and _is_text(choices.value_type),
                 "a list of strings")
    elif spec.answer_regex:
        _require(rows, spec, split, spec.answer, _is_text(answer), "text for --answer-regex to search")
    else:
        _require(rows, spec, split, spec.answer,
                 _is_text(answer) or pa.types.is_integer(answer) or pa.types.is_floating(answer), "text or a number")


def _is_text(arrow_type: pa.DataType) -> bool:
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def _require(rows: datasets.Dataset, spec: "WrapSpec", split: str, column: str, ok: bool, wanted: str) -> None:
    if not ok:
        raise EnvContractError(f"column {column!r} holds {rows.features[column]}, not {wanted} (row 0 is "
                               f"{_short(rows[0][column])})", spec.where(split, "row 0", column),
                               f"name a column that holds {wanted}, or convert this one first (e.g. with "
                               f"datasets.Dataset.map) and wrap the result")


def check_values(rows: datasets.Dataset, spec: "WrapSpec", split: str) -> None:
    """Per row: a non-empty prompt and answer; the gold answer in the form the reward reads."""
    pattern = re.compile(spec.answer_regex) if spec.answer_regex else None
    columns = [rows[c] for c in columns_of(spec)]
    for index, values in enumerate(zip(*columns)):
        prompt, answer = values[0], values[-1]
        where = lambda column: spec.where(split, f"row {index}", column)  # noqa: E731
        if prompt is None or not prompt.strip():
            raise EnvContractError(f"the prompt is empty ({prompt!r})", where(spec.prompt),
                                   "drop or fill the rows without a question, then wrap again")
        if answer is None or (isinstance(answer, str) and not answer.strip()):
            raise EnvContractError(f"the answer is empty ({answer!r})", where(spec.answer),
                                   "drop or fill the rows without an answer, then wrap again")
        if spec.reward == "choice":
            _check_choice(values[1], answer, where, spec)
            continue
        try:
            gold = gold_of(answer, spec, pattern)
        except RegexTimeout:
            raise EnvContractError(f"--answer-regex {spec.answer_regex!r} ran for more than {REGEX_LIMIT_S:g} s on "
                                   f"the answer {_short(answer)} and was stopped", where(spec.answer),
                                   "write a regex that cannot backtrack that much: no quantifier inside another "
                                   "((a+)+, (a*)*, (a|aa)+), anchor what you can") from None
        if gold is None:
            raise EnvContractError(f"--answer-regex {spec.answer_regex!r} does not match the answer "
                                   f"{_short(answer)}", where(spec.answer),
                                   "give a regex that matches every row's answer column")
        if spec.reward == "numeric" and len(_NUMBER.findall(gold)) != 1:
            raise EnvContractError(f"the gold answer {_short(gold)} does not hold exactly one number",
                                   where(spec.answer), numeric_fix(gold))


def numeric_fix(gold: str) -> str:
    if "####" in gold:
        return f"take the number after '####' with --answer-regex '{GSM8K_REGEX}'"
    return ("take the number out of the column with --answer-regex (its first group is the answer), or use "
            "--reward math_verify (fractions, expressions) or --reward exact (text)")


def _check_choice(choices: Any, answer: Any, where: Any, spec: "WrapSpec") -> None:
    if not choices or len(choices) > len(LETTERS) or any(c is None or not str(c).strip() for c in choices):
        raise EnvContractError(f"the choices {_short(choices)} are not 1 to {len(LETTERS)} non-empty strings",
                               where(spec.choices), "drop or fix the row's choices, then wrap again")
    if isinstance(answer, int):
        ok = 0 <= answer < len(choices)
    else:
        ok = answer.strip().upper() in LETTERS[:len(choices)] and len(answer.strip()) == 1
    if not ok:
        raise EnvContractError(f"the answer {answer!r} names none of the row's {len(choices)} choices",
                               where(spec.answer),
                               f"give a 0-based index below {len(choices)} or a letter from A to "
                               f"{LETTERS[len(choices) - 1]} in the answer column")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- the wrapped env, built and scored ------------------------------------------------------------

def golden_cases_from_data(folder: Path, spec: "WrapSpec", source_rows: dict[str, list[int]]) -> list[dict]:
    """Build the staged env; every row's gold answer must earn the top of the range. Then golden cases from the
    first rows: the gold answer (top), a wrong answer and a reply without <answer> (bottom)."""
    from hubgym.envs.build import make_builder
    from hubgym.builders.registry import load_builder_file
    from hubgym.schemas import assistant

    cls = load_builder_file(folder / "builder.py")
    verifier = cls.verifier()
    low, high = verifier.reward_range
    tasks: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="hubgym-wrap-") as cache:
        builder = make_builder(cls, "default", cache_dir=cache)
        for generator in builder._split_generators(None):
            split = str(generator.name)
            for index, (_, task) in enumerate(builder._generate_examples(**generator.gen_kwargs)):
                score = verifier.score(task, [assistant(f"<answer>{task['info']['answer']}</answer>")])
                if score.reward != high:
                    raise EnvContractError(
                        f"the gold answer {_short(task['info']['answer'])} scores {score.reward} (error "
                        f"{score.error}), not {high}, from the {spec.reward} verifier",
                        spec.where(split, f"row {source_rows[split][index]}", spec.answer), gold_fix(spec))
                tasks.append(task)
    first = tasks[0]

    def case(name: str, task: dict, content: str, reward: float) -> dict:
        return {"name": name, "task": {"info": task["info"]}, "completion": [{"role": "assistant",
                                                                              "content": content}], "reward": reward}

    wrong = next((c for c in wrong_candidates(first, tasks) if verifier.score(
        first, [assistant(f"<answer>{c}</answer>")]).reward == low), None)
    cases = [case("gold answer", first, f"<answer>{first['info']['answer']}</answer>", high)]
    if len(tasks) > 1:
        cases.append(case("gold answer, second row", tasks[1], f"<answer>{tasks[1]['info']['answer']}</answer>", high))
    if "choices" in first["info"]:
        chosen = first["info"]["choices"][LETTERS.index(first["info"]["answer"])]
        cases.append(case("gold choice by its text", first, f"<answer>{chosen}</answer>", high))
    if wrong is not None:
        cases.append(case("wrong answer", first, f"<answer>{wrong}</answer>", low))
    cases.append(case("no answer tag", first, f"The answer is {first['info']['answer']}.", low))
    return cases


def wrong_candidates(task: dict, tasks: list[dict]) -> list[str]:
    """Answers that should score nothing on `task`: the other choices, other rows' answers, then stock ones."""
    info = task["info"]
    if "choices" in info:
        return [letter for letter in LETTERS[:len(info["choices"])] if letter != info["answer"]]
    others = [t["info"]["answer"] for t in tasks[:50] if t["info"]["answer"] != info["answer"]]
    return [*others, "0", "1", "-1", "none of these"]


def gold_fix(spec: "WrapSpec") -> str:
    if spec.reward == "math_verify":
        return "fix the row, or use --reward exact when the answers are text rather than math"
    return "fix the row, or pick the --reward (and --answer-regex) that reads this column's answers"
