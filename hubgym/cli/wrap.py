"""`hubgym wrap`: a dataset (local files or a Hub id) as a single-turn env folder that passes `hubgym check`.

    hubgym wrap data/quiz --prompt question --answer answer --reward exact --out envs/quiz
    hubgym wrap openai/gsm8k --config main --prompt question --answer answer --reward numeric \\
        --answer-regex '####\\s*(.+)$' --split-map train=train,test=test --limit 500 --out envs/gsm8k_numeric
    hubgym wrap data/mcq --prompt question --choices choices --answer answer --reward choice --out envs/mcq
    hubgym check envs/quiz && hubgym push envs/quiz my-org/quiz
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from hubgym.cli.app import app, console, user_errors


class Reward(str, Enum):
    exact = "exact"
    numeric = "numeric"
    math_verify = "math_verify"
    choice = "choice"


@app.command()
@user_errors
def wrap(dataset: Annotated[str, typer.Argument(help="a folder of Parquet/JSON/CSV files (or one such file), or "
                                                     "a Hub dataset id (read through the Hugging Face cache)")],
         prompt: Annotated[str, typer.Option(help="column holding the question text")],
         answer: Annotated[str, typer.Option(help="column holding the gold answer (choice: a 0-based index or a "
                                                  "letter)")],
         reward: Annotated[Reward, typer.Option(help="how a reply's <answer> is compared with the gold answer")],
         out: Annotated[Path, typer.Option(help="the env folder to create")],
         config: Annotated[Optional[str], typer.Option(help="the dataset's config (subset)")] = None,
         revision: Annotated[Optional[str], typer.Option(help="the dataset's revision (Hub datasets)")] = None,
         split_map: Annotated[Optional[str], typer.Option(help="ENV_SPLIT=SOURCE_SPLIT,... (default: every "
                                                              "split under its own name)")] = None,
         choices: Annotated[Optional[str], typer.Option(help="column holding the list of choices (--reward "
                                                           "choice)")] = None,
         answer_regex: Annotated[Optional[str], typer.Option(help="the gold answer is this regex's first group "
                                                                 "(or whole match) in the answer column, e.g. "
                                                                 "'####\\s*(.+)$' for GSM8K")] = None,
         system: Annotated[Optional[str], typer.Option(help="system prompt; the answer-format sentence is added "
                                                          "unless it mentions <answer>")] = None,
         tolerance: Annotated[float, typer.Option(help="relative tolerance of --reward numeric")] = 1e-6,
         name: Annotated[Optional[str], typer.Option(help="env name (default: from DATASET's name)")] = None,
         limit: Annotated[Optional[int], typer.Option(help="keep at most the first N rows of each split")] = None,
         force: Annotated[bool, typer.Option("--force", help="replace --out when it exists and is not empty")]
         = False) -> None:
    """Write an env folder (builder, verifier, golden cases, README, data/) made from a dataset's columns."""
    from hubgym.authoring.wrap import WrapSpec, parse_split_map, wrap_dataset

    spec = WrapSpec(dataset, prompt=prompt, answer=answer, reward=reward.value, out=out, config=config,
                    revision=revision, split_map=parse_split_map(split_map), choices=choices, system=system,
                    answer_regex=answer_regex, tolerance=tolerance, name=name, limit=limit, force=force)
    with console().status(f"wrapping {dataset}"):
        folder = wrap_dataset(spec)
    data = sorted((folder / "data").iterdir())
    console().print(Text(f"created {folder}/ (env {spec.env!r}): builder.py, verifier.py, golden.jsonl, README.md, "
                         f"data/ ({', '.join(p.name for p in data)})", style="green"), soft_wrap=True)
    console().print(Text(f"next: hubgym check {folder}   then   hubgym push {folder} ORG/{spec.env}"), soft_wrap=True)
