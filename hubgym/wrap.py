"""`hubgym wrap`: any dataset `datasets.load_dataset` reads becomes a single-turn env folder.

    spec = WrapSpec("openai/gsm8k", prompt="question", answer="answer", reward="numeric",
                    out=Path("envs/gsm8k_numeric"), config="main", answer_regex=r"####\\s*(.+)$")
    folder = wrap_dataset(spec)   # -> envs/gsm8k_numeric/{builder.py, verifier.py, golden.jsonl, README.md, data/}

The env is self-contained: the columns it reads are copied into `data/<split>.parquet`, so it builds
offline, its ids never move with the source, and `hubgym push` needs nothing else. The builder,
verifier and README come from `hubgym/templates/wrap/*.tmpl`; the golden cases come from the data
(each gold answer, a wrong answer and a reply without an answer, scored by the generated verifier).

Before anything is written the source is checked (columns exist and hold the right types, no row is
empty, every gold answer earns full reward from its own verifier); a bad source is one
EnvContractError naming the env, config, split, row and field. The folder is made beside `out`
and renamed into place, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import json
import os
import math
import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

import datasets

from hubgym.errors import EnvContractError, Where
from hubgym.fileio import replace_dir
from hubgym.scaffold import NAME_RULE, class_name, validate_env_name
from hubgym.wrap_checks import (check_source, columns_of, dedup, golden_cases_from_data, limit_rows,
                                local_files_hold_no_rows)

TEMPLATES = Path(__file__).parent / "templates" / "wrap"
FILE_FORMATS = {".jsonl": "json", ".tsv": "csv"}  # other suffixes name their packaged builder (.parquet, .csv, ...)


@dataclass(frozen=True)
class RewardKind:
    """What a `--reward` choice puts into the generated env's prompt, verifier and docs."""

    answer_format: str  # the sentence of the system prompt that states the answer format
    answer_what: str  # "reply with <answer_what> inside <answer></answer>"
    short: str  # one line for the README
    doc: str  # the Reward section of the builder docstring


REWARD_KINDS: dict[str, RewardKind] = {
    "exact": RewardKind("Give your final answer inside <answer></answer>.", "the answer",
                        "normalized text match",
                        "correct (weight 1): the text in the reply's <answer> equals info.answer, both\n"
                        "    case-folded, with whitespace and final punctuation normalized. Total in [0, 1]."),
    "numeric": RewardKind("Give the final number inside <answer></answer>.", "the final number",
                          "number equality within a relative tolerance",
                          "correct (weight 1): the one number in the reply's <answer> equals the number in\n"
                          "    info.answer within a relative tolerance of {tolerance}. Total in [0, 1]."),
    "math_verify": RewardKind("Give the final answer inside <answer></answer>.", "the final answer",
                              "mathematical equality by math-verify",
                              "correct (weight 1): the reply's <answer> equals info.answer by math-verify\n"
                              "    (\"1/2\", \"0.5\" and \"\\frac{{1}}{{2}}\" agree). Total in [0, 1]."),
    "choice": RewardKind("Reply with the letter of the correct choice inside <answer></answer>.",
                         "the letter of the right choice", "the letter (or text) of the right choice",
                         "correct (weight 1): the reply's <answer> names the right choice, by its letter\n"
                         "    (\"B\", \"(b)\", \"B. text\") or its full text. Total in [0, 1]."),
}
DEFAULT_LEAD = {"choice": "Answer the multiple-choice question."}  # other rewards: "Answer the question."


@dataclass
class WrapSpec:
    """Everything `hubgym wrap` needs; validated once, in `validate`."""

    dataset: str  # a folder of Parquet/JSON/CSV files (or one such file), or a Hub dataset id
    prompt: str  # column holding the question text
    answer: str  # column holding the gold answer (choice: a 0-based index or a letter)
    reward: str  # exact | numeric | math_verify | choice
    out: Path  # the env folder to create
    config: str | None = None  # the source's config (subset)
    revision: str | None = None  # the source's revision (Hub datasets), recorded in the env's docs
    split_map: dict[str, str] = field(default_factory=dict)  # env split -> source split; empty: every split as is
    choices: str | None = None  # column holding the list of choices (reward choice)
    system: str | None = None  # system prompt; the answer-format sentence is added when it lacks "<answer>"
    answer_regex: str | None = None  # the gold answer is what this captures in the answer column
    tolerance: float = 1e-6  # numeric: relative tolerance
    name: str | None = None  # env name; default: from the dataset's name
    limit: int | None = None  # keep at most this many rows per split (the first ones)
    force: bool = False  # replace a non-empty `out`
    cache_dir: str | None = None  # datasets' cache for reading the source

    @property
    def env(self) -> str:
        return self.name or env_name_for(self.dataset)

    def where(self, split: str | None = None, row: str | None = None, field: str | None = None) -> Where:
        return Where(self.env, self.config, split, row, field)

    def validate(self) -> None:
        """Refuse option combinations that cannot make an env, before the source is read."""
        try:
            validate_env_name(self.env)
        except EnvContractError as exc:
            raise EnvContractError(exc.what, self.where(field="--name"), f"pass --name with a free name of "
                                   f"{NAME_RULE}, e.g. --name {env_name_for(self.env)}_wrapped") from None
        if self.reward not in REWARD_KINDS:
            raise EnvContractError(f"unknown reward {self.reward!r}", self.where(field="--reward"),
                                   f"use one of: {', '.join(REWARD_KINDS)}")
        if (self.reward == "choice") != (self.choices is not None):
            raise EnvContractError("--choices names the column of choices, which only --reward choice uses"
                                   if self.choices else "--reward choice needs the column of choices",
                                   self.where(field="--choices"),
                                   "pass --reward choice with --choices COLUMN (a list of strings per row), or "
                                   "neither")
        if self.answer_regex is not None:
            if self.reward == "choice":
                raise EnvContractError("--answer-regex does not apply to --reward choice",
                                       self.where(field="--answer-regex"), "leave --answer-regex out")
            try:
                re.compile(self.answer_regex)
            except re.error as exc:
                raise EnvContractError(f"--answer-regex {self.answer_regex!r} is not a regular expression ({exc})",
                                       self.where(field="--answer-regex"),
                                       "give a Python regex; its first group (or whole match) is the answer, "
                                       "e.g. '####\\s*(.+)$'") from None
        if self.limit is not None and self.limit < 1:
            raise EnvContractError(f"--limit is {self.limit}", self.where(field="--limit"), "give --limit >= 1")
        if not (math.isfinite(self.tolerance) and self.tolerance >= 0):  # NaN would match nothing, inf everything
            raise EnvContractError(f"--tolerance is {self.tolerance}", self.where(field="--tolerance"),
                                   "give a relative tolerance >= 0, e.g. 1e-6")
        check_out_folder(self)

    def command(self) -> str:
        """The `hubgym wrap` command line that makes this env (recorded in its README)."""
        args = ["hubgym", "wrap", self.dataset]
        options = [("--config", self.config), ("--revision", self.revision), ("--name", self.name),
                   ("--split-map", ",".join(f"{k}={v}" for k, v in self.split_map.items()) or None),
                   ("--prompt", self.prompt), ("--answer", self.answer), ("--choices", self.choices),
                   ("--answer-regex", self.answer_regex), ("--reward", self.reward), ("--system", self.system),
                   ("--limit", self.limit),
                   ("--tolerance", self.tolerance if self.reward == "numeric" and self.tolerance != 1e-6 else None),
                   ("--out", self.out.name)]
        args += [str(part) for option, value in options if value is not None for part in (option, value)]
        return " ".join(shlex.quote(arg) for arg in args)

    def system_prompt(self) -> str:
        kind = REWARD_KINDS[self.reward]
        if self.system and "<answer>" in self.system:
            return self.system
        return f"{self.system or DEFAULT_LEAD.get(self.reward, 'Answer the question.')} {kind.answer_format}"


def env_name_for(dataset: str) -> str:
    """'openai/gsm8k' -> 'gsm8k', 'data/My-Quiz' -> 'my_quiz': the dataset's last name, as an identifier."""
    path = Path(dataset.rstrip("/"))
    name = re.sub(r"[^a-z0-9_]+", "_", (path.stem if path.is_file() else path.name).lower()).strip("_")
    return name if re.match(r"[a-z]", name) else f"env_{name}"


def check_out_folder(spec: WrapSpec) -> None:
    out = spec.out
    if out.is_file() or (out.is_symlink() and not out.is_dir()):
        raise EnvContractError(f"--out {out} is a file", spec.where(field="--out"), "give a folder path for --out")
    if out.is_dir() and any(out.iterdir()) and not spec.force:
        raise EnvContractError(f"--out {out} exists and is not empty; hubgym wrap never overwrites files unless told",
                               spec.where(field="--out"), "pick another --out, or pass --force to replace it")


def wrap_dataset(spec: WrapSpec) -> Path:
    """Check the source, write the env folder beside `spec.out`, prove it builds and scores, rename it in."""
    spec.validate()
    splits, revision = read_source(spec)
    rows = {split: limit_rows(source, spec, split) for split, source in splits.items()}
    check_source(rows, spec)
    kept = {split: dedup(source, spec) for split, source in rows.items()}  # {split: (rows, their source indices)}
    spec.out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.out.name}-wrap-", dir=spec.out.parent))
    try:
        write_data({split: unique for split, (unique, _) in kept.items()}, staging / "data")
        sizes = {split: len(unique) for split, (unique, _) in kept.items()}
        for file_name, text in render(spec, sizes, revision).items():
            (staging / file_name).write_text(text)
        golden = golden_cases_from_data(staging, spec, {split: indices for split, (_, indices) in kept.items()})
        (staging / "golden.jsonl").write_text("".join(json.dumps(case) + "\n" for case in golden))
        if spec.out.is_dir() and not any(spec.out.iterdir()):
            spec.out.rmdir()
        replace_dir(staging, spec.out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return spec.out


def read_source(spec: WrapSpec) -> tuple[dict[str, datasets.Dataset], str | None]:
    """The source's splits under the env's split names ({env split: rows}), and the Hub commit they came from."""
    path, revision = spec.dataset, spec.revision
    if not Path(path).exists() and not is_repo_id(path):
        raise EnvContractError(f"cannot read dataset {path!r}: there is no such folder or file",
                               spec.where(field="DATASET"), "give the path of a folder of Parquet/JSON/CSV files, "
                               "or a Hub dataset id such as openai/gsm8k")
    from_hub = not Path(path).exists()
    if from_hub and hub_offline():
        path, revision = cached_hub_snapshot(spec)
    try:
        if Path(path).is_file():  # one data file: the packaged builder of its format, as split "train"
            loaded = datasets.load_dataset(FILE_FORMATS.get(Path(path).suffix, Path(path).suffix.lstrip(".")),
                                           data_files={"train": path}, cache_dir=spec.cache_dir)
        else:
            loaded = datasets.load_dataset(path, spec.config, revision=None if path != spec.dataset else revision,
                                           cache_dir=spec.cache_dir)
    except Exception as exc:  # datasets raises many kinds: FileNotFoundError, ArrowInvalid, DatasetNotFoundError...
        if local_files_hold_no_rows(spec.dataset):  # datasets fails on empty files rather than giving 0 rows
            raise EnvContractError(f"dataset {spec.dataset!r} is empty: its data files hold no rows",
                                   spec.where(field="DATASET"), "wrap a dataset with rows") from None
        raise EnvContractError(f"cannot read dataset {spec.dataset!r}: {type(exc).__name__}: {exc}",
                               spec.where(field="DATASET"),
                               "give a folder of Parquet/JSON/CSV files or a Hub dataset id that datasets.load_dataset "
                               "reads (with --config for a dataset with several configs; a Hub dataset must be in "
                               "the Hugging Face cache to work offline)") from None
    if from_hub and path == spec.dataset:  # read online: the commit it read is now in the Hub cache
        revision = cached_commit(spec) or revision
    mapping = spec.split_map or {split: split for split in loaded}
    missing = [source for source in mapping.values() if source not in loaded]
    if missing:
        raise EnvContractError(f"the dataset has no split {missing[0]!r}; it has {sorted(loaded)}",
                               spec.where(split=missing[0], field="--split-map"),
                               f"map env splits to existing ones, e.g. --split-map train={sorted(loaded)[0]}")
    return {env_split: loaded[source] for env_split, source in mapping.items()}, revision


def is_repo_id(text: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def cached_commit(spec: WrapSpec) -> str | None:
    """The commit of the Hub dataset's cached snapshot (what `load_dataset` just fetched); None when unknown."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(spec.dataset, repo_type="dataset", revision=spec.revision,
                                      local_files_only=True)).name
    except Exception:  # not in the Hub cache (datasets keeps some sources elsewhere): the docs name no commit
        return None


def hub_offline() -> bool:
    """HF_HUB_OFFLINE, read now (huggingface_hub and datasets read it once, at import)."""
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return flag in {"1", "ON", "YES", "TRUE"} or bool(constants.HF_HUB_OFFLINE)


def cached_hub_snapshot(spec: WrapSpec) -> tuple[str, str]:
    """A Hub dataset's files as the Hugging Face cache holds them (offline), and their commit.

    datasets' own offline mode only finds datasets it has prepared before; the Hub cache also holds
    datasets fetched by huggingface_hub (`hf download --repo-type dataset ...`).
    """
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(spec.dataset, repo_type="dataset", revision=spec.revision,
                                        local_files_only=True))
    except Exception as exc:  # not a repo id, or not cached
        raise EnvContractError(f"cannot read dataset {spec.dataset!r}: it is not a folder, and HF_HUB_OFFLINE is set "
                               f"but the Hugging Face cache does not hold it ({type(exc).__name__})",
                               spec.where(field="DATASET"),
                               f"download it once (hf download {spec.dataset} --repo-type dataset), or unset "
                               f"HF_HUB_OFFLINE") from None
    return str(folder), folder.name


def parse_split_map(text: str | None) -> dict[str, str]:
    """'train=train,test=validation' (or 'test=validation' alone) -> {env split: source split}."""
    mapping: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        env_split, eq, source = (s.strip() for s in item.partition("="))
        if not eq or not re.fullmatch(r"\w+", env_split) or not source:
            raise EnvContractError(f"--split-map entry {item!r} is not ENV_SPLIT=SOURCE_SPLIT",
                                   Where(field="--split-map"),
                                   "write it as train=train,test=validation (env split names: letters, digits, _)")
        mapping[env_split] = source
    return mapping


def write_data(splits: dict[str, datasets.Dataset], folder: Path) -> None:
    folder.mkdir()
    for split, rows in splits.items():
        rows.to_parquet(str(folder / f"{split}.parquet"))


def render(spec: WrapSpec, sizes: dict[str, int], revision: str | None = None) -> dict[str, str]:
    """builder.py, verifier.py and README.md of the env (golden.jsonl is made from them afterwards)."""
    kind = REWARD_KINDS[spec.reward]
    text = {  # prose: escaped where it lands in a Python docstring
        "summary": summary(spec), "prompt_column": spec.prompt, "answer_column": spec.answer,
        "choices_column": spec.choices or "", "answer_doc": answer_doc(spec),
        "reward_doc": kind.doc.format(tolerance=spec.tolerance), "source_doc": source_doc(spec, revision),
    }
    code = {
        "name": spec.env, "cls": class_name(spec.env), "reward": spec.reward, "folder": spec.out.name,
        "prompt_literal": literal(spec.prompt), "answer_literal": literal(spec.answer),
        "choices_literal": literal(spec.choices), "system_literal": literal(spec.system_prompt()),
        "pattern_literal": regex_literal(spec.answer_regex or ""), "sizes": literal(sizes),
        "tolerance": repr(spec.tolerance), "answer_what": kind.answer_what, "reward_short": kind.short,
        "split_doc": ", ".join(f"{split} {n}" for split, n in sizes.items()), "command": spec.command(),
        "columns": ", ".join(f"`{c}`" for c in columns_of(spec)),
    }
    in_python = {**code, **{key: doc_text(value) for key, value in text.items()}}
    builder = "builder_choice" if spec.reward == "choice" else "builder_pattern" if spec.answer_regex else "builder"
    return {
        "builder.py": Template((TEMPLATES / f"{builder}.py.tmpl").read_text()).substitute(in_python),
        "verifier.py": Template((TEMPLATES / f"verifier_{spec.reward}.py.tmpl").read_text()).substitute(in_python),
        "README.md": Template((TEMPLATES / "README.md.tmpl").read_text()).substitute({**code, **text}),
    }


def summary(spec: WrapSpec) -> str:
    kind = "multiple-choice questions" if spec.reward == "choice" else "questions"
    return f"{kind} from the dataset {spec.dataset}" + (f" ({spec.config})" if spec.config else "")


def answer_doc(spec: WrapSpec) -> str:
    if spec.reward == "choice":
        return "a 0-based index or a letter"
    if spec.answer_regex:
        return f"what ANSWER_PATTERN captures in column `{spec.answer}`"
    return f"column `{spec.answer}`"


def source_doc(spec: WrapSpec, revision: str | None) -> str:
    parts = [f"{spec.dataset!r}"] + [f"config {spec.config!r}"] * bool(spec.config) + \
        [f"revision {revision!r}"] * bool(revision)
    splits = ", ".join(f"{env}={source}" for env, source in spec.split_map.items())
    return (", ".join(parts) + ", read with datasets.load_dataset" + (f"; splits {splits}" if splits else "")
            + (f"; at most the first {spec.limit} rows per split" if spec.limit else "")
            + "; rows repeated in a split are kept once.")


def doc_text(text: str) -> str:
    """Text safe inside the builder's plain (non-raw) triple-quoted docstring."""
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def literal(value: str | dict | None) -> str:
    """A Python literal in the double quotes a person writes (JSON's string and dict syntax is Python's)."""
    return json.dumps(value, ensure_ascii=False)


def regex_literal(pattern: str) -> str:
    """A raw-string literal where one can hold the pattern (what a person writes), else repr()."""
    if '"' not in pattern and "\n" not in pattern and not pattern.endswith("\\"):
        return f'r"{pattern}"'
    return repr(pattern)
