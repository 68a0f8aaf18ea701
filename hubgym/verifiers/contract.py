"""The verifier contract: a module of pure functions that scores what a model did.

A verifier module declares

    REWARDS = {correct_answer: 1.0, well_formatted: 0.0}   # fn(task, completion) -> float; weight 0 = metric
    BATCH_REWARDS = {similarity: 1.0}                       # fn(tasks, completions) -> list[float], one per row
    REWARD_RANGE = (0.0, 1.0)                               # optional; bounds of the total reward
    SUCCESS_THRESHOLD = 1.0                                 # optional; a rollout with reward >= it succeeded
                                                            # (default: the sum of the rewards' positive weights,
                                                            # shaping aside; multi_turn: the top of REWARD_RANGE)

with REWARDS, BATCH_REWARDS or both. A batch reward scores many rows in one call (the form TRL's reward
functions take: a vectorized or cached parse pays there); each row's value must depend on that row alone,
since the rollout loop batches a group's samples and a re-score batches stored rows in other ways. Every
reward's component name is its function's name; "answer_found", "steps" and "tool_calls" are reserved.

optionally the answer parser that the rewards use (a reply where it finds none is an
answer-format failure; `hubgym report` shows their share as `no_answer`):

    def parse_answer(task, completion) -> str | None        # None (or blank): no answer found

and, for multi_turn environments, the MDP:

    def reset(task) -> (state, observation)
    def step(task, state, action) -> (state, observation, reward, done)

where `state` is JSON data. The total reward is the weighted sum of REWARDS and BATCH_REWARDS, plus the summed
step rewards (component "steps") for multi_turn, plus per-call tool shaping (component
"tool_calls") when the task's interaction spec has `tool_rewards`. A verifier with
`parse_answer` also gets the weight-0 component "answer_found" (1.0 or 0.0): it is stored on
every scored row and never changes a reward.

Pure means deterministic, no network, no filesystem writes, no global state, and the task and
completion given are left as they are (the rollout loop scores a group's samples with one task
object): a stored rollout can be re-scored and replayed anywhere, forever. A verifier exception is never a
reward: `score` and `score_batch` record it on the row's result and leave its `reward` as None
(hubgym.verifiers.batches says how a failing batch reward is narrowed to the rows that fail it).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

from hubgym.errors import VerifierLoadError, Where
from hubgym.files import import_source
from hubgym.schemas.messages import Message, user
from hubgym.schemas.tasks import Task
from hubgym.verifiers.batches import RESERVED, BatchRewardFn, score_rows
from hubgym.verifiers.batches import (ANSWER_FOUND, Score, actions_of, exact,  # noqa: F401  (the contract's surface)
                                      raised_at)

State = Any  # JSON-serializable
RewardFn = Callable[[Task, list[Message]], float]
ResetFn = Callable[[Task], tuple[State, str]]
StepFn = Callable[[Task, State, str], tuple[State, str, float, bool]]
ParseFn = Callable[[Task, list[Message]], str | None]


@dataclass(frozen=True)
class Step:
    action: str
    observation: str
    reward: float
    done: bool
    state: State


@dataclass(frozen=True)
class Episode:
    """A multi_turn episode: the reset observation and one Step per action."""

    observation: str
    steps: list[Step] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return bool(self.steps) and self.steps[-1].done

    def completion(self) -> list[Message]:
        """The trajectory as messages: each action as an assistant turn, each observation as a user turn."""
        from hubgym.schemas.messages import assistant

        messages: list[Message] = []
        for s in self.steps:
            messages.append(assistant(s.action))
            if s.observation:
                messages.append(user(s.observation))
        return messages


CUT_FINISHES = ("length", "context_length")  # finish reasons of a reply cut short


def last_reply_cut(completion: list[Message], finish_reason: str | None, steps_stored: int | None) -> bool:
    """Whether a trajectory's last action is a reply cut short (by max_tokens or the context): the rollout loop
    never gives such a reply to `step`, so scoring and replay leave it out of the episode too.

    A run out of context *before* generating also ends in "context_length"; its last reply was then stepped,
    which the number of stored step rewards (`steps_stored`, None when unknown) shows.
    """
    if finish_reason not in CUT_FINISHES or not completion:
        return False
    last = completion[-1]
    if last["role"] != "assistant" or last.get("tool_calls"):
        return False
    return finish_reason == "length" or steps_stored is None or steps_stored < len(actions_of(completion))


def stored_step_rewards(metrics: list[dict] | None) -> dict[int, float] | None:
    """{step index: reward} from a row's `step/<i>/reward` metrics; None for rows written before they were stored."""
    found = {}
    for m in metrics or []:
        parts = m["name"].split("/")
        if len(parts) == 3 and parts[0] == "step" and parts[2] == "reward" and parts[1].isdigit():
            found[int(parts[1])] = m["value"]
    return found or None


class Verifier:
    """A loaded, validated verifier module, with the env's own tools (`tools`: an EnvTools, empty unless the env
    ships a tools module). The tools travel with the verifier because both are the env's code, loaded together
    under one pin: the rollout loop and the token audit resolve a row's tool names in them first."""

    def __init__(self, module: ModuleType, env: str | None = None, *, source: bytes | None = None):
        from hubgym.tools.modules import NO_TOOLS

        self.module = module
        self.tools = NO_TOOLS
        self.code_sha256 = ""  # a hub env's pin: the sha256 over its code files (hubgym.hub.trust.code_sha256)
        self.name = module.__name__
        self.env = env
        self.source_path = Path(inspect.getsourcefile(module) or "")
        if source is None and self.source_path.is_file():
            source = self.source_path.read_bytes()
        self.sha256 = hashlib.sha256(source).hexdigest() if source is not None else ""  # of the bytes that ran
        self.reset: ResetFn | None = getattr(module, "reset", None)
        self.step: StepFn | None = getattr(module, "step", None)
        _check_mdp(module, env, self.reset, self.step)
        self.rewards: dict[str, tuple[RewardFn, float]] = _read_rewards(module, env)
        self.batch_rewards: dict[str, tuple[BatchRewardFn, float]] = _read_batch_rewards(module, env, self.rewards)
        self.weights: dict[str, float] = {name: weight for table in (self.rewards, self.batch_rewards)
                                          for name, (_, weight) in table.items()}  # every reward, in scoring order
        self.parse_answer: ParseFn | None = _read_parser(module, env)
        self.reward_range: tuple[float, float] = _read_range(module, env)
        self.success_threshold = _read_threshold(module, self.weights, self.reward_range, self.step is not None)

    @property
    def multi_turn(self) -> bool:
        return self.step is not None

    def run_episode(self, task: Task, actions: list[str]) -> Episode:
        """Reset, then apply `actions` until the episode is done (extra actions are ignored)."""
        if self.reset is None or self.step is None:
            raise VerifierLoadError(f"verifier {self.name!r} has no reset/step", Where(env=self.env, field="step"),
                                    "only multi_turn verifiers can run episodes")
        state, observation = self.reset(task)
        episode = Episode(observation)
        for action in actions:
            state, obs, reward, done = self.step(task, state, action)
            episode.steps.append(Step(action, obs, float(reward), bool(done), state))
            if done:
                break
        return episode

    def succeeded(self, score: Score) -> bool:
        """Success for pass@k: the total reward reaches SUCCESS_THRESHOLD."""
        return score.reward is not None and score.reward >= self.success_threshold - 1e-9

    def score(self, task: Task, completion: list[Message], *, cut: bool = False) -> Score:
        """Score a trajectory. Exceptions and non-finite rewards become `Score.error`, never a reward.

        cut: the last reply was cut short and never stepped (`last_reply_cut`); a multi_turn episode then ends
        before it, as it did in the rollout loop, so the stored reward and a re-score agree with the loop.
        The same as `score_batch` of a batch of one (batch rewards are called with that batch)."""
        return score_rows(self, [task], [completion], [cut])[0]

    def score_batch(self, tasks: Sequence[Task], completions: Sequence[list[Message]],
                    cuts: Sequence[bool] | None = None) -> list[Score]:
        """Score many trajectories at once: exactly what `score` gives each row (same components, totals and
        errors), with each BATCH_REWARDS function called once for the whole batch. `cuts`: `score`'s `cut` per
        row (None: no row was cut)."""
        return score_rows(self, tasks, completions, cuts)


def _read_threshold(module: ModuleType, weights: dict[str, float], reward_range: tuple[float, float],
                    multi_turn: bool) -> float:
    """SUCCESS_THRESHOLD, else what a fully correct reply earns from its rewards alone (each reward at 1.0: the sum of
    the positive weights), so tool shaping on top never makes a correct answer without tools a failure; an env whose
    reward comes from its steps succeeds at the top of REWARD_RANGE."""
    if hasattr(module, "SUCCESS_THRESHOLD"):
        return float(module.SUCCESS_THRESHOLD)
    positive = sum(weight for weight in weights.values() if weight > 0)
    return min(positive, reward_range[1]) if positive and not multi_turn else reward_range[1]








def _read_parser(module: ModuleType, env: str | None) -> ParseFn | None:
    fn = getattr(module, "parse_answer", None)
    if fn is not None and (not callable(fn) or len(inspect.signature(fn).parameters) != 2):
        raise VerifierLoadError(f"parse_answer {fn!r} is not a function of (task, completion)",
                                Where(env=env, field="parse_answer"),
                                "define `def parse_answer(task, completion) -> str | None`")
    return fn


def _read_rewards(module: ModuleType, env: str | None) -> dict[str, tuple[RewardFn, float]]:
    table = getattr(module, "REWARDS", None)
    if table is None and hasattr(module, "BATCH_REWARDS"):  # batch rewards alone (_read_batch_rewards checks them)
        return {}
    if not isinstance(table, dict) or (not table and not hasattr(module, "step")):
        raise VerifierLoadError(f"verifier {module.__name__!r} has no REWARDS dict", Where(env=env, field="REWARDS"),
                                "declare REWARDS = {reward_fn: weight, ...} (or BATCH_REWARDS = {batch_fn: weight, "
                                "...}) at module level")
    return _read_table(table, "REWARDS", "each reward is `def name(task, completion) -> float`", env, {})


def _read_batch_rewards(module: ModuleType, env: str | None,
                        rewards: dict[str, tuple[RewardFn, float]]) -> dict[str, tuple[BatchRewardFn, float]]:
    table = getattr(module, "BATCH_REWARDS", None)
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise VerifierLoadError(f"BATCH_REWARDS of verifier {module.__name__!r} is a {type(table).__name__}, not a "
                                f"dict", Where(env=env, field="BATCH_REWARDS"),
                                "declare BATCH_REWARDS = {batch_fn: weight, ...} at module level")
    if not table and not rewards and not hasattr(module, "step"):
        raise VerifierLoadError(f"verifier {module.__name__!r} has no rewards: BATCH_REWARDS is empty and there is no "
                                f"REWARDS", Where(env=env, field="BATCH_REWARDS"),
                                "declare at least one reward in BATCH_REWARDS = {batch_fn: weight, ...}")
    return _read_table(table, "BATCH_REWARDS", "each batch reward is `def name(tasks, completions) -> list[float]` "
                       "(one float per row, in the order of the rows)", env, rewards)


def _read_table(table: dict, field: str, form: str, env: str | None, taken: dict) -> dict[str, tuple[Any, float]]:
    """{component name: (fn, weight)} of REWARDS or BATCH_REWARDS; names must be free (not reserved, not `taken`)."""
    where = Where(env=env, field=field)
    rewards: dict[str, tuple[Any, float]] = {}
    for fn, weight in table.items():
        if not callable(fn) or len(inspect.signature(fn).parameters) != 2:
            args = "(tasks, completions)" if field == "BATCH_REWARDS" else "(task, completion)"
            raise VerifierLoadError(f"{field} key {fn!r} is not a function of {args}", where, form)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise VerifierLoadError(f"{field} weight for {fn.__name__!r} is {weight!r}", where, "weights are floats")
        name = fn.__name__
        if name in RESERVED:
            raise VerifierLoadError(f"{field} has a function named {name!r}, a component name hubgym reserves "
                                    f"({', '.join(RESERVED)})", where, "rename that reward function")
        if name in taken:
            raise VerifierLoadError(f"BATCH_REWARDS has a function named {name!r}, and so does REWARDS: each reward's "
                                    f"component name is its function's name", where, "rename one of the two")
        rewards[name] = (fn, float(weight))
    return rewards


def _read_range(module: ModuleType, env: str | None) -> tuple[float, float]:
    lo, hi = getattr(module, "REWARD_RANGE", (0.0, 1.0))
    if not lo < hi:
        raise VerifierLoadError(f"REWARD_RANGE {(lo, hi)} is empty", Where(env=env, field="REWARD_RANGE"),
                                "declare REWARD_RANGE = (low, high) with low < high")
    return float(lo), float(hi)


def _check_mdp(module: ModuleType, env: str | None, reset, step) -> None:
    if (reset is None) != (step is None):
        raise VerifierLoadError(f"verifier {module.__name__!r} defines only one of reset/step",
                                Where(env=env, field="reset" if reset is None else "step"),
                                "a multi_turn verifier defines both reset(task) and step(task, state, action)")
    for fn, arity in ((reset, 1), (step, 3)):
        if fn is not None and len(inspect.signature(fn).parameters) != arity:
            raise VerifierLoadError(f"{fn.__name__} takes {len(inspect.signature(fn).parameters)} arguments, "
                                    f"expected {arity}",
                                    Where(env=env, field=fn.__name__),
                                    "use reset(task) and step(task, state, action)")


def load_verifier(ref: str | ModuleType, *, relative_to: Path | None = None, env: str | None = None,
                  source: bytes | None = None) -> Verifier:
    """Load a verifier from a module, a dotted module name, or a `.py` path (relative to `relative_to`).

    A `.py` path is read once and those bytes are what runs and what `sha256` hashes; a caller that
    already read and checked them (a pinned hub verifier) passes them as `source`. The path keeps its
    symlinks: the Hugging Face cache links `snapshots/<commit>/verifier.py` to `blobs/<sha>`, and the
    module keeps the `.py` name it was given.
    """
    if isinstance(ref, ModuleType):
        return Verifier(ref, env)
    if ref.endswith(".py"):
        path = (relative_to / ref) if relative_to and not Path(ref).is_absolute() else Path(ref)
        path = Path(os.path.abspath(path))  # absolute, without resolving links (see above)
        try:
            source = path.read_bytes() if source is None else source
        except OSError as exc:  # a path from the command line: missing, a folder, unreadable
            raise VerifierLoadError(f"verifier {ref} cannot be read ({type(exc).__name__}: {exc.strerror or exc})",
                                    Where(env=env, field=ref), _LOAD_FIX) from None
        return Verifier(import_source(path, source), env, source=source)
    try:
        module = importlib.import_module(ref)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (ref == exc.name or ref.startswith(exc.name + ".")):
            raise  # the module exists, and one of its own imports is missing
        raise VerifierLoadError(f"no module named {ref!r}", Where(env=env, field=ref), _LOAD_FIX) from None
    return Verifier(module, env)


_LOAD_FIX = "give the path of a verifier .py file, or the import name of an installed verifier module"
