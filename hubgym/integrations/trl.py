"""Any hubgym env inside TRL's `GRPOTrainer` (trl 1.16; `pip install 'hubgym[trl]'`).

    from trl import GRPOConfig, GRPOTrainer
    from hubgym.integrations.trl import trl_env, tool_parsing_tokenizer

    env = trl_env("wordle", split="train")                       # a name, ENV:CONFIG, a folder or a pinned hub ref
    args = GRPOConfig(output_dir="out", reward_weights=env.reward_weights, max_steps=100)
    trainer = GRPOTrainer(model, args=args, processing_class=tool_parsing_tokenizer(tokenizer), **env.trainer_kwargs())
    trainer.train()

What TRL gets, built against exactly what 1.16's `GRPOTrainer.__init__` takes:

- `train_dataset`: one row per task, `prompt` (the task's messages, conversational) and `hubgym_task` (the whole
  task row as JSON: TRL passes extra columns to reward functions and to the environment's `reset`).
- `reward_funcs` with `reward_weights` (for `GRPOConfig`): one function per weighted reward of the verifier
  (REWARDS and BATCH_REWARDS), plus `steps` (multi_turn: the summed step rewards) and `tool_calls` (per-call
  shaping), weight 1 each, and the weight-0 metric `answer_found` where the verifier parses answers. The weighted
  total TRL computes is exactly `Verifier.score`'s reward. TRL's batch is scored once, by `Verifier.score_batch`:
  a batch reward gets TRL's whole batch in one call, and every function reads its component from that. A
  verifier that raises gives None from every function, which TRL treats as unscorable (no advantage), never as
  a reward; the error is kept on the environment for inspection.
- `environment_factory` for tool_use and multi_turn envs (TRL's environment interface is tool calls): each
  instance is one rollout; `reset(**row)` starts it from `hubgym_task`; the env's tools are its methods, each call
  going through hubgym's `Toolbox` (argument validation, timeouts, `Error: ...` results); a multi_turn env adds
  `act(action)`, which gives the action to the verifier's `step` and returns the observation (the rules of
  `hubgym.verifiers.act`). A multi_turn prompt says how that game is played (a move is a call of `act`; text
  outside it is none), and the `reset` observation follows it as a user turn, as in hubgym's own loop.
- Scores come from TRL's completions alone: a multi_turn one is read as the episode its env saw
  (`hubgym.verifiers.act.env_view`), so a stored completion re-scores to the reward TRL trained on.

`TRLEnv.record(trainer, "runs/x")` stores every generation batch TRL makes as a hubgym run
(hubgym.integrations.trl_record).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hubgym.integrations.trl_messages import (INSTALL, TASK_COLUMN, from_trl_completion,  # noqa: F401 (the API)
                                              played_through_act, trl_message)
from hubgym.schemas.messages import Message, assistant, tool_call, user
from hubgym.schemas.tasks import Task
from hubgym.verifiers.act import ACT_TOOL, ENV_FAILED, ActEpisode
from hubgym.verifiers.contract import ANSWER_FOUND, Score, Verifier

ACT_NOTE = (f"Make each move by calling the tool `{ACT_TOOL}` with the move as `action`, written as asked above; "
            f"what you write outside `{ACT_TOOL}` is not a move.")
"""Appended to a multi_turn task's prompt under TRL: there a move is a call of `act`, not a reply's text."""


@dataclass
class TRLEnv:
    """One hubgym env, split and verifier, in the shapes `GRPOTrainer` takes."""

    env: str
    config: str
    verifier: Verifier
    tasks: list[Task]
    split: str = "train"
    provenance: dict[str, Any] = field(default_factory=dict)  # OpenedEnv.provenance(): verifier, repo, revision
    scorer: "BatchScorer" = field(init=False)

    def __post_init__(self) -> None:
        self.scorer = BatchScorer(self.verifier)

    def __repr__(self) -> str:
        """One line, not every task row: what a notebook or a log shows."""
        return (f"TRLEnv({self.env}:{self.config}, split={self.split!r}, {len(self.tasks)} tasks, {self.kind}, "
                f"rewards={[name for name, _ in self.components]})")

    @property
    def kind(self) -> str:
        """single_turn, tool_use or multi_turn: the most demanding kind among the rows (one loop drives them all)."""
        kinds = {t["interaction"]["kind"] for t in self.tasks}
        return next((k for k in ("multi_turn", "tool_use") if k in kinds), "single_turn")

    @property
    def train_dataset(self):
        """A `datasets.Dataset` of `prompt` (messages) and `hubgym_task` (the task row as JSON)."""
        import datasets

        return datasets.Dataset.from_dict({
            "prompt": [[trl_message(m) for m in trl_prompt(t, self.verifier)] for t in self.tasks],
            TASK_COLUMN: [json.dumps(t, default=str) for t in self.tasks],
        })

    @property
    def components(self) -> list[tuple[str, float]]:
        """(component name, weight) in the order of `reward_funcs`."""
        out = [(ANSWER_FOUND, 0.0)] if self.verifier.parse_answer is not None else []
        out += list(self.verifier.weights.items())
        if self.verifier.multi_turn:
            out.append(("steps", 1.0))
        if any(t["interaction"]["tool_rewards"] for t in self.tasks):
            out.append(("tool_calls", 1.0))
        return out

    @property
    def reward_funcs(self) -> list[Callable[..., list[float | None]]]:
        return [self.scorer.component_fn(name) for name, _ in self.components]

    @property
    def reward_weights(self) -> list[float]:
        """For `GRPOConfig(reward_weights=...)`: with them TRL's weighted sum is `Verifier.score`'s reward."""
        return [weight for _, weight in self.components]

    @property
    def environment_factory(self) -> Callable[[], Any] | None:
        """A class for TRL's `environment_factory` (None for single_turn envs: nothing to drive)."""
        if self.kind == "single_turn":
            return None
        return environment_class(self.env, self.verifier, self.tasks)

    def trainer_kwargs(self) -> dict[str, Any]:
        """`train_dataset`, `reward_funcs` and, when the env needs one, `environment_factory`."""
        kwargs: dict[str, Any] = {"train_dataset": self.train_dataset, "reward_funcs": self.reward_funcs}
        if self.environment_factory is not None:
            kwargs["environment_factory"] = self.environment_factory
        return kwargs

    def record(self, trainer: Any, out: str | Path, *, run_id: str | None = None) -> Any:
        """Store every generation batch `trainer` (a GRPOTrainer built from `trainer_kwargs()`) makes as a hubgym
        run in `out`: token ids as TRL generated them, the mask, sampling logprobs, rewards and provenance
        (hubgym.integrations.trl_record). Returns the recorder; the run is complete when training ends."""
        from hubgym.integrations.trl_record import TRLRecorder

        return TRLRecorder.attach(trainer, self, out, run_id=run_id)


def trl_env(spec: str, split: str = "train", limit: int | None = None, *, hub: str | None = None,
            trust: bool = False, pins: dict[str, str] | None = None) -> TRLEnv:
    """An env's tasks and verifier for TRL: `spec` is what `hubgym rollout` takes (`ENV[:CONFIG]`, a folder, or a
    hub ref `org/name@rev[:CONFIG]` with `pins={"org/name": "sha256:..."}` or `trust=True`)."""
    from hubgym.envs import open_env

    loaded = open_env(spec, hub=hub, trust=trust, pins=pins)
    return TRLEnv(loaded.env, loaded.config, loaded.verifier, loaded.take(split, limit), split, loaded.provenance())


def trl_prompt(task: Task, verifier: Verifier) -> list[Message]:
    """The prompt TRL gets for a task: the task's own; a multi_turn one says how a move is made under TRL
    (`ACT_NOTE`, after its last user message) and ends with the env's `reset` observation as a user turn, as hubgym's
    own loop sends it (the verifier is pure: the same task always opens with the same observation)."""
    prompt = list(task["prompt"])
    if task["interaction"]["kind"] != "multi_turn" or not verifier.multi_turn:
        return prompt
    last = max((i for i, m in enumerate(prompt) if m["role"] == "user"), default=None)
    if last is None:
        prompt.append(user(ACT_NOTE))
    else:
        prompt[last] = {**prompt[last], "content": f"{prompt[last]['content'] or ''}\n\n{ACT_NOTE}"}
    _, observation = verifier.reset(task)
    return prompt + [user(observation)] if observation else prompt


# -- rewards ---------------------------------------------------------------------------------------------------------

class BatchScorer:
    """Scores each completion once per batch: TRL calls every reward function with the same `completions` list, so
    the scores of the last list are kept (compared by identity, and held so the list cannot be freed and its id
    reused) and each function reads its own component."""

    def __init__(self, verifier: Verifier):
        self.verifier = verifier
        self._batch: tuple[Any, list[Score]] | None = None

    def scores(self, completions: list, tasks: list[str], environments: list | None) -> list[Score]:
        """The Score of each completion of TRL's batch (computed once per batch: see the class docstring)."""
        if self._batch is not None and self._batch[0] is completions:
            return self._batch[1]
        envs = list(environments) if environments else [None] * len(completions)
        rows = [played_through_act(json.loads(task_json)) for task_json in tasks]
        # one call for TRL's whole batch: a verifier's BATCH_REWARDS get it as one batch, as in hubgym's own loop;
        # a multi_turn completion is read as the episode its env saw (hubgym.verifiers.act.env_view)
        scores = self.verifier.score_batch(rows, [from_trl_completion(c) for c in completions])
        for env, score in zip(envs, scores, strict=True):
            if isinstance(env, HubgymTRLEnv):
                env.last_score = score
        self._batch = (completions, scores)
        return scores

    def component_fn(self, name: str) -> Callable[..., list[float | None]]:
        def reward(prompts: list, completions: list, hubgym_task: list[str], environments: list | None = None,
                   **_: Any) -> list[float | None]:
            return [s.components.get(name) if s.reward is not None else None
                    for s in self.scores(completions, hubgym_task, environments)]

        reward.__name__ = name  # TRL logs `rewards/<name>/mean`
        reward.__qualname__ = name
        return reward


# -- the environment TRL drives --------------------------------------------------------------------------------------

class HubgymTRLEnv:
    """One rollout of a hubgym env under TRL: built by the factory, reset per example, tools as methods.

    Subclasses made by `environment_class` add one method per tool of the env (and `act` for multi_turn)."""

    VERIFIER: Verifier
    ENV: str

    def __init__(self) -> None:
        self.task: Task | None = None
        self.trajectory: list[Message] = []  # what the env saw, in hubgym's form (env_view of TRL's completion)
        self.episode: ActEpisode | None = None  # multi_turn: the episode behind `act`
        self.error: dict[str, str] | None = None  # an env step that raised (the rollout's error, as in hubgym's loop)
        self.last_score: Score | None = None
        self._toolbox = None

    def __repr__(self) -> str:
        task = self.task["id"] if self.task else None
        return f"{type(self).__name__}(task={task!r}, steps={len(self.step_rewards)}, done={self.done})"

    @property
    def done(self) -> bool:
        return self.episode is not None and self.episode.done

    @property
    def step_rewards(self) -> list[float]:
        """The reward of each env step `act` took (stored as `step/<i>/reward`, what a replay checks)."""
        return list(self.episode.rewards) if self.episode is not None else []

    def reset(self, **row: Any) -> None:
        """Start a rollout of the row's task. Returns None: a multi_turn `reset` observation is already the last
        turn of the prompt TRL got (`trl_prompt`)."""
        from hubgym.tools.registry import make_toolbox

        self.task = json.loads(row[TASK_COLUMN])
        self.trajectory, self.error, self.last_score = [], None, None
        tools = self.task["interaction"]["tools"]
        self._toolbox = make_toolbox(tools, self.task, self.VERIFIER.tools) if tools else None
        self.episode = ActEpisode(self.VERIFIER, self.task) if self.VERIFIER.multi_turn else None
        return None

    def _act(self, action: Any) -> str:
        if self.episode is None or self.task is None:
            raise RuntimeError("act called before reset")
        if self.error is not None:
            return f"{ENV_FAILED} ({self.error['type']}); the episode is over."
        try:
            outcome = self.episode.act(action)
        except Exception as exc:  # the env failed: recorded, the episode stops (a bad rollout is data)
            self.error = {"boundary": "env", "type": type(exc).__name__, "message": str(exc)[:2000]}
            self.episode.done = True
            return f"{ENV_FAILED} ({type(exc).__name__}); the episode is over."
        if outcome.reward is not None:
            self.trajectory.append(assistant(action))
            if outcome.observation:
                self.trajectory.append(user(outcome.observation))
        return outcome.result

    def _call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        if self._toolbox is None:
            return f"Error: UnknownTool: this task offers no tool {name!r}"
        call = tool_call(f"call-{len(self.trajectory)}-0", name, json.dumps(arguments))
        outcome = self._toolbox.call(call)
        self.trajectory += [assistant(None, [call]), outcome.message]
        return outcome.message["content"] or ""


def environment_class(env: str, verifier: Verifier, tasks: list[Task]) -> type[HubgymTRLEnv]:
    """A `HubgymTRLEnv` subclass whose methods are the env's tools (its own, then hubgym's registry) and, for a
    multi_turn env, `act`. TRL reads tool schemas from the class's methods (signature, type hints, docstring)."""
    methods: dict[str, Any] = {"VERIFIER": verifier, "ENV": env}
    for schema in _tool_schemas(tasks, verifier):
        methods[schema["name"]] = _tool_method(schema)
    if verifier.multi_turn:
        methods[ACT_TOOL] = _act_method()
    return type(f"{_class_name(env)}Env", (HubgymTRLEnv,), methods)


def _tool_schemas(tasks: list[Task], verifier: Verifier) -> list[dict[str, Any]]:
    """Each tool the rows offer, once, as its OpenAI function schema (from the first row offering it; the env's
    own tools, which travel with its verifier, first)."""
    from hubgym.tools.registry import make_toolbox

    seen: dict[str, dict[str, Any]] = {}
    for task in tasks:
        names = [n for n in task["interaction"]["tools"] if n not in seen]
        if names:
            for schema in make_toolbox(names, task, verifier.tools).schemas():
                seen.setdefault(schema["function"]["name"], schema["function"])
    return list(seen.values())


_JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def _tool_method(schema: dict[str, Any]) -> Callable[..., str]:
    """A method with the tool's name, typed parameters and a Google-style docstring, calling hubgym's Toolbox."""
    name = schema["name"]
    props = schema.get("parameters", {}).get("properties", {})
    required = set(schema.get("parameters", {}).get("required", []))

    def method(self, **arguments: Any) -> str:
        return self._call_tool(name, arguments)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"return": str}
    for arg, spec in props.items():
        annotations[arg] = _JSON_TYPES.get(spec.get("type", "string"), str)
        default = inspect.Parameter.empty if arg in required else spec.get("default")
        params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=annotations[arg]))
    method.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    method.__name__ = method.__qualname__ = name
    args_doc = "\n".join(f"    {arg}: {(spec.get('description') or arg).strip()}" for arg, spec in props.items())
    method.__doc__ = f"{(schema.get('description') or name).strip()}\n\nArgs:\n{args_doc}\n" if props else \
        (schema.get("description") or name)
    return method


def _act_method() -> Callable[..., str]:
    def act(self, action: str) -> str:  # no hint on self: TRL reads every hint as a tool argument
        """Take your turn in the environment: your whole move, written as the task asks for it.

        Args:
            action: the move, e.g. the text the task asks you to reply with
        """
        return self._act(action)

    return act


def _class_name(env: str) -> str:
    return "".join(part.capitalize() for part in env.replace("-", "_").split("_") if part) or "Hubgym"


# -- the tokenizer -----------------------------------------------------------------------------------------------------

def tool_parsing_tokenizer(tokenizer: Any) -> Any:
    """The tokenizer, able to parse tool calls in TRL: TRL knows response formats only for chat templates it ships;
    a template that writes Hermes `<tool_call>{json}</tool_call>` blocks (hubgym's tiny model, Qwen-style models)
    gets TRL's Qwen response template, which parses that format. Templates TRL knows, tokenizers that already have
    a response template, and templates that write no tool calls at all are returned as they are."""
    try:
        from trl.chat_template_utils import add_response_schema, qwen3_template
    except ImportError as exc:
        raise ImportError(f"TRL is not installed: {INSTALL}") from exc
    if getattr(tokenizer, "response_template", None) is not None:
        return tokenizer
    try:
        return add_response_schema(tokenizer)
    except ValueError:  # a template TRL does not know
        pass
    if "<tool_call>" in (tokenizer.chat_template or ""):
        tokenizer.response_template = qwen3_template
    # Else a template that writes no tool calls (SmolLM2's ChatML): single_turn envs need no parser, and TRL itself
    # refuses tool_use and multi_turn envs with it, saying the template does not support tool calling.
    return tokenizer
