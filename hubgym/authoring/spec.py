"""What `hubgym wrap` is asked for: the options (WrapSpec), validated once, and the reward kinds it offers.

    spec = WrapSpec("openai/gsm8k", prompt="question", answer="answer", reward="numeric", out=Path("envs/x"))
    spec.validate()          # one EnvContractError naming the option and the fix, before the source is read
    spec.command()           # the `hubgym wrap ...` line that makes this env again
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from hubgym.authoring.scaffold import validate_env_name
from hubgym.envs.refs import ENV_NAME_RULE
from hubgym.errors import EnvContractError, Where


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
                                   f"{ENV_NAME_RULE}, e.g. --name {env_name_for(self.env)}_wrapped") from None
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


