"""A multi_turn episode played through the tool `act` (TRL's environment interface), and how its stored messages read
as the episode the env saw.

hubgym's own loop gives each text reply of a multi_turn row to the verifier's `step`. TRL's GRPOTrainer drives an
environment through tool calls only, so `hubgym.integrations.trl` offers a multi_turn env there as a tool
`act(action)`: one call is one step, its result is the observation, and text outside it is no action. A row played
that way names `act` among its interaction's tools, and its completion holds the messages as the model saw them
(assistant turns with tool calls, tool results), so its token record renders from them.

`env_view` turns such a completion into the trajectory the env saw, in hubgym's form (each stepped action an
assistant turn and its observation a user turn; calls of the env's other tools kept with their results): what the
verifier's rewards score, so a re-score of a stored row gives what the run gave. One set of rules (`ActEpisode`)
serves the tool itself, scoring and replay:

- a call reaches the tool only when it was run (it has a result message) with arguments that are exactly
  `{"action": ...}` (TRL refuses other arguments before the tool runs);
- it steps the env when its action is text, the episode is not over and fewer than `max_turns` actions were
  stepped; otherwise it returns one of the fixed refusals below and steps nothing.

    episode = ActEpisode(verifier, task)
    outcome = episode.act("<guess>crane</guess>")     # .result (what the tool returns), .reward (None: no step)
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from hubgym.schemas.messages import Message, assistant, user
from hubgym.schemas.tasks import Task

ACT_TOOL = "act"
EPISODE_OVER = "The episode is over; stop calling act."
NO_TURNS_LEFT = "No turns are left; the episode is over."
ENDED = "The episode is over."  # the result of a step that ended the episode with no observation
NOT_TEXT = "Error: act takes your move as text (action: a string)."
ENV_FAILED = "Error: the environment failed"  # how a call whose step raised is answered (then the episode is over)


def driven_by_act(interaction: dict[str, Any]) -> bool:
    """Whether a row's episode was played through `act`: a multi_turn interaction that offers the tool."""
    return interaction["kind"] == "multi_turn" and ACT_TOOL in (interaction.get("tools") or [])


def act_result(observation: str, done: bool) -> str:
    """What a stepping call returns: the observation; a step that ended the episode silently says so."""
    return observation or (ENDED if done else "")


def act_action(arguments: Any) -> tuple[bool, Any]:
    """(whether the call reaches the tool, its action): arguments (JSON text or a dict) must be exactly
    {"action": value}; a call with others is refused by TRL before the tool runs."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return False, None
    if not isinstance(arguments, dict) or set(arguments) != {"action"}:
        return False, None
    return True, arguments["action"]


class ActOutcome(NamedTuple):
    result: str  # what the tool returns to the model
    reward: float | None  # the step's reward; None when the call stepped nothing
    observation: str  # the env's observation ("" when it stepped nothing or gave none)


class ActEpisode:
    """One episode behind the `act` tool: the verifier's pure reset/step and the tool's rules, nothing else.

    A step that raises propagates (the caller records it: an env error in a run, a verifier error in a re-score,
    a divergence in a replay) and leaves the episode as it was."""

    def __init__(self, verifier: Any, task: Task):
        self.verifier, self.task = verifier, task
        self.state, self.observation = verifier.reset(task)
        self.rewards: list[float] = []  # the reward of each stepped action
        self.done = False

    def act(self, action: Any) -> ActOutcome:
        """One call of the tool with `action` (checked here: the model may send anything)."""
        if not isinstance(action, str):
            return ActOutcome(NOT_TEXT, None, "")
        if self.done:
            return ActOutcome(EPISODE_OVER, None, "")
        if len(self.rewards) >= self.task["interaction"]["max_turns"]:
            self.done = True
            return ActOutcome(NO_TURNS_LEFT, None, "")
        state, observation, reward, done = self.verifier.step(self.task, self.state, action)
        self.state, self.done = state, bool(done)
        self.rewards.append(float(reward))
        return ActOutcome(act_result(observation or "", self.done), float(reward), observation or "")


def env_view(verifier: Any, task: Task, completion: list[Message]) -> list[Message]:
    """The trajectory the env saw in a completion played through `act`: each stepped action as an assistant turn
    and its observation as a user turn, each call of another tool with its result, in order (text the model wrote
    around them is no action). Calls that were never run, or whose result is not in the completion (TRL drops a
    result that would not fit `max_completion_length`: the model never saw it), are left out. A step that raises
    propagates."""
    view, _, error = play(verifier, task, completion)
    if error is not None:
        raise error
    return view


def play(verifier: Any, task: Task, completion: list[Message]) -> tuple[list[Message], ActEpisode, Exception | None]:
    """(`env_view`, the episode played: its step rewards, and the exception a step raised, which ends the play)."""
    results = {m["tool_call_id"]: m for m in completion if m["role"] == "tool" and m.get("tool_call_id")}
    episode, out = ActEpisode(verifier, task), []
    for m in completion:
        for call in (m.get("tool_calls") or []) if m["role"] == "assistant" else []:
            result = results.get(call["id"])
            if result is None:
                continue
            if call["name"] != ACT_TOOL:
                out += [assistant(None, [call]), result]
                continue
            reaches, action = act_action(call["arguments"])
            if not reaches:
                continue
            try:
                outcome = episode.act(action)
            except Exception as exc:  # the caller says what it is: an env error, a verifier error, a divergence
                return out, episode, exc
            if outcome.reward is not None:
                out.append(assistant(action))
                if outcome.observation:
                    out.append(user(outcome.observation))
    return out, episode, None
