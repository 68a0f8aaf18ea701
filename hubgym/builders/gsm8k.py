"""GSM8K: grade-school math word problems (openai/gsm8k), answered in one turn.

Task:
    Solve a word problem and give the final number inside `<answer>...</answer>` (`\\boxed{}`,
    `#### n` or a trailing number are accepted too).
Row schema:
    info = {"answer": str (the number after "####", commas removed), "solution": str (the
    worked solution, with its <<calculator>> annotations)}; interaction single_turn, max_turns 1.
Reward:
    correct (weight 1): the extracted answer equals info.answer by math-verify ("18.0", "$18",
    "\\frac{36}{2}" and "1,000" vs "1000" all agree). formatted (weight 0, a metric): the reply
    marks its answer (<answer>, \\boxed{} or ####). Total in [0, 1].
Arguments:
    configs tiny (default: the 12 train / 8 test problems shipped in data/gsm8k_tiny, offline)
    and main (openai/gsm8k, config "main", loaded with datasets.load_dataset; falls back to the
    tiny fixture with a warning when HF_HUB_OFFLINE is set or the Hub is unreachable).
    GSM8KConfig.source (Hub repo id, or a local folder laid out like the repo: README.md with
    `configs:` and main/train-00000-of-00001.parquet), .subset; TaskConfig.sizes caps each split
    (a seeded sample when smaller than the split) and TaskConfig.seed draws that sample.
Version history:
    v1: first release.
"""

from __future__ import annotations

import os
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import datasets

from hubgym.builders.base import TaskBuilder, TaskConfig, split_seed
from hubgym.errors import EnvContractError, Where
from hubgym.schemas import Task, make_task, system, user

HUB_REPO = "openai/gsm8k"
FIXTURE = Path(__file__).parent / "data" / "gsm8k_tiny"  # {train,test}.jsonl in the Hub's row format
SPLITS = ("train", "test")
SYSTEM = ("Solve the math word problem. Reason step by step, then give the final number inside "
          "<answer></answer>.")


@dataclass
class GSM8KConfig(TaskConfig):
    source: str | None = HUB_REPO  # Hub repo id, or a local folder laid out like it; None = the shipped fixture
    subset: str = "main"  # the source's config name
    sizes: dict[str, int] = field(default_factory=lambda: {"train": 7473, "test": 1319})  # caps, not targets


class GSM8K(TaskBuilder):
    __doc__ = __doc__
    ENV = "gsm8k"
    TAGS = ("math", "word_problems", "real_data")
    VERIFIER = "hubgym.verifiers.gsm8k"
    GOLDEN = "golden/gsm8k.jsonl"
    BUILDER_CONFIG_CLASS = GSM8KConfig
    BUILDER_CONFIGS = [
        GSM8KConfig(name="tiny", source=None, sizes={"train": 12, "test": 8}),
        GSM8KConfig(name="main", source=HUB_REPO, subset="main"),
    ]

    def _split_generators(self, dl_manager: Any) -> list[datasets.SplitGenerator]:
        """Load the source once (Hub, local copy, or fixture); one split per `config.sizes` entry."""
        source = self._load_source()
        self._check_splits(source)
        return [datasets.SplitGenerator(name=split, gen_kwargs={"split": split, "rows": source[split], "size": size,
                                                                "seed": split_seed(self.config.seed, split)})
                for split, size in self.config.sizes.items()]

    def generate_tasks(self, split: str, rows: datasets.Dataset, size: int, seed: int) -> Iterator[Task]:
        picked = range(len(rows)) if size >= len(rows) else sorted(random.Random(seed).sample(range(len(rows)), size))
        seen: set[str] = set()
        for index in picked:
            row = rows[index]
            answer, solution = self._parse_answer(row, split, index)
            task = make_task(self.ENV, [system(SYSTEM), user(row["question"].strip())],
                             {"answer": answer, "solution": solution})
            if task["id"] not in seen:  # a problem listed twice in the source is one task
                seen.add(task["id"])
                yield task

    def _load_source(self) -> datasets.DatasetDict:
        cfg, cache = self.config, self._cache_dir_root
        if cfg.source is None:
            return _load_fixture(cache)
        unreachable = None if Path(cfg.source).is_dir() else _hub_unreachable(cfg.source)
        if unreachable:
            return self._fallback(unreachable)
        try:
            return datasets.load_dataset(cfg.source, cfg.subset, cache_dir=cache)
        except ConnectionError as exc:  # what datasets raises when the Hub cannot be reached
            if Path(cfg.source).is_dir():
                raise
            return self._fallback(f"the Hub is unreachable ({exc})")

    def _fallback(self, why: str) -> datasets.DatasetDict:
        warnings.warn(f"gsm8k config {self.config.name!r}: {why}, so the build uses the shipped {FIXTURE.name} "
                      f"fixture (20 problems) instead of {self.config.source!r}. Connect to the Hub and unset "
                      f"HF_HUB_OFFLINE for the full data, or build config 'tiny' to mean the fixture", stacklevel=2)
        return _load_fixture(self._cache_dir_root)

    def _check_splits(self, source: datasets.DatasetDict) -> None:
        for split in self.config.sizes:
            if split not in source:
                raise EnvContractError(f"the source has no split {split!r} (it has {sorted(source)})",
                                       Where(self.ENV, self.config.name, split, field="sizes"),
                                       f"list only the source's splits in sizes, or point `source` at a copy with "
                                       f"{split!r}")

    def _parse_answer(self, row: dict[str, Any], split: str, index: int) -> tuple[str, str]:
        """Split "worked solution\\n#### 42" into ("42", "worked solution")."""
        solution, marker, final = str(row.get("answer") or "").rpartition("####")
        answer = final.strip().replace(",", "")
        if not marker or not answer or not isinstance(row.get("question"), str):
            raise EnvContractError(f"source row {index} is not in gsm8k form (a question string and an answer "
                                   f"ending '#### <number>'): {str(row)[:200]}",
                                   Where(self.ENV, self.config.name, split, f"row {index}", "answer"),
                                   "fix the source row, or point `source` at data in the openai/gsm8k format")
        return answer, solution.strip()


def _load_fixture(cache_dir: str) -> datasets.DatasetDict:
    files = {split: str(FIXTURE / f"{split}.jsonl") for split in SPLITS}
    return datasets.load_dataset("json", data_files=files, cache_dir=cache_dir)


def _hub_unreachable(repo: str) -> str | None:
    """Why the Hub cannot serve `repo` now, or None; one quick request, where load_dataset retries for ~25 s.

    HF_HUB_OFFLINE is read at call time (datasets reads it once, at import).
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    flag = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    if flag in {"1", "ON", "YES", "TRUE"} or datasets.config.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    try:
        HfApi().dataset_info(repo, timeout=10)
    except HfHubHTTPError:
        return None  # the Hub answered (say, no such repo): load_dataset reports that clearly
    except Exception as exc:  # no answer at all: DNS failure, refused connection, timeout
        return f"the Hub is unreachable ({type(exc).__name__}: {exc})"
    return None
