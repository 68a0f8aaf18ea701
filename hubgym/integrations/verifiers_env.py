"""A hubgym env as a verifiers 0.4 environment (`pip install 'hubgym[verifiers]'`), run by verifiers' own `vf-eval`:

    vf-eval hubgym_verifiers --env.taskset.env wordle --env.taskset.split test --env.taskset.limit 8 \\
        --model MODEL --client.base-url http://127.0.0.1:8000/v1 --env.agent.harness.id null \\
        --env.agent.runtime.type subprocess --no-push

verifiers 0.4 (`verifiers.v1`) splits an environment into a taskset (data: `HubgymTaskset` yields the env's task
rows, each carrying the whole row as JSON) and an `Env` whose `run` plays one episode with the agent seat as the
model: `HubgymEnv` sends the prompt (with a multi_turn env's `reset` observation), and for a multi_turn env gives
each reply to the verifier's `step` and sends its observation back as the next user turn until the episode is done
or `max_turns` replies were made (a reply cut at max_tokens ends it unstepped, as in hubgym's loop). The
trajectory is then scored by hubgym's verifier, and each reward component is recorded on the trace with its
weight (steps and tool shaping at weight 1, metrics at 0), so verifiers' weighted total is `Verifier.score`'s.

tool_use envs are not offered: verifiers serves tools to its harness programs as MCP servers, which hubgym's tools
are not. This module is the only one that imports verifiers; `hubgym import verifiers` reads what it writes
without it.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic
import verifiers.v1 as vf

from hubgym.schemas.messages import Message, assistant, user

__all__ = ["HubgymData", "HubgymEnv", "HubgymEnvConfig", "HubgymTask", "HubgymTaskset", "HubgymTasksetConfig"]


class HubgymTasksetConfig(vf.TasksetConfig):
    env: str = "arithmetic"
    """The hubgym env, as `hubgym rollout` takes it: ENV[:CONFIG] or a folder."""
    split: str = "test"
    limit: int | None = None
    """The first this many tasks of the split (all when unset)."""

    @pydantic.field_validator("env")
    @classmethod
    def _offered(cls, env: str) -> str:
        """A tool_use env is refused while vf-eval reads its config, where its CLI shows a refusal as one line
        (a refusal while the tasks load comes after a page of traceback)."""
        refusal = tool_use_refusal(env)
        if refusal:
            raise ValueError(refusal)
        return env


def tool_use_refusal(env: str) -> str | None:
    """Why an env is not offered to verifiers (its kind is tool_use), or None."""
    from hubgym.envs import open_env

    loaded = open_env(env)
    if loaded.kind != "tool_use":
        return None
    return (f"hubgym env {loaded.env!r} is tool_use, which hubgym does not offer to verifiers (verifiers serves tools "
            f"to its harness programs as MCP servers, and hubgym's tools are Python functions); give a single_turn or "
            f"multi_turn env (hubgym envs --kind multi_turn), or run it with `hubgym rollout` or TRL")


class HubgymData(vf.TaskData):
    hubgym_task: str
    """The hubgym task row as JSON: the verifier scores against it, `hubgym import verifiers` restores it."""


class HubgymTask(vf.Task[HubgymData, vf.State, vf.TaskConfig]):
    pass


class HubgymTaskset(vf.Taskset[HubgymTask, HubgymTasksetConfig]):
    def load(self):
        from hubgym.envs import open_env

        loaded = open_env(self.config.env)
        for task in loaded.take(self.config.split, self.config.limit):
            if task["interaction"]["kind"] == "tool_use":
                raise ValueError(f"env {loaded.env!r} row {task['id']!r}: tool_use rows are not offered to verifiers "
                                 f"(its tools are MCP servers); use a single_turn or multi_turn env")
            prompt = list(task["prompt"])
            if loaded.verifier.multi_turn:  # the reset observation follows the prompt, as in hubgym's rollout loop
                _, observation = loaded.verifier.reset(task)
                prompt += [user(observation)] if observation else []
            yield HubgymTask(HubgymData(id=task["id"], name=f"{loaded.env}/{task['id']}",
                                        prompt=[_wire(m) for m in prompt],
                                        hubgym_task=json.dumps(task, default=str)), self.config.task)


class HubgymEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class HubgymEnv(vf.Env[HubgymEnvConfig]):
    async def run(self, task, agents):
        row = json.loads(task.data.hubgym_task)
        verifier = self.verifier()
        trajectory: list[Message] = []
        state = verifier.reset(row)[0] if verifier.multi_turn else None  # its observation is in the task's prompt
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()
            actions, cut = 0, False
            while not segment.terminated:
                reply = segment.last_reply or ""
                trajectory.append(assistant(reply))
                actions += 1
                cut = _last_finish(interaction.trace) == "length"
                if not verifier.multi_turn or cut:  # a reply cut at max_tokens is no action: the episode ends
                    break
                state, observation, _, done = verifier.step(row, state, reply)
                if observation:
                    trajectory.append(user(observation))
                if done or actions >= row["interaction"]["max_turns"]:
                    # the episode's last observation reaches no model turn, so verifiers' message graph lacks it;
                    # hubgym's rows keep it (the import puts it back)
                    interaction.trace.info["hubgym_final_observation"] = observation or ""
                    break
                segment = await interaction.turn(observation or "")
        record_score(interaction.trace, verifier, row, trajectory, cut)

    def verifier(self):
        """The verifier of the taskset's env (its ENV[:CONFIG] spec: a name or a folder), loaded once."""
        if getattr(self, "_verifier", None) is None:
            from hubgym.envs import open_env

            self._verifier = open_env(self.config.taskset.env).verifier
        return self._verifier


def record_score(trace: Any, verifier: Any, row: dict, trajectory: list[Message], cut: bool) -> None:
    """hubgym's score of the episode as verifiers rewards: one per component, with its hubgym weight. A last reply
    cut at max_tokens is scored as hubgym's loop scores it (`cut`: never an env action)."""
    score = verifier.score(row, trajectory, cut=cut)
    if score.error is not None:
        trace.info["hubgym_error"] = dict(score.error)
        return
    weights = verifier.weights
    for name, value in score.components.items():
        trace.record_reward(name, value, weights.get(name, 1.0 if name in ("steps", "tool_calls") else 0.0))
    trace.info["hubgym_reward"] = score.reward


def _last_finish(trace: Any) -> str | None:
    """Why the last model call of the episode stopped ("stop", "length", ...)."""
    return trace.calls[-1].finish_reason if trace.calls else None


def _wire(m: Message) -> dict[str, Any]:
    return {"role": m["role"], "content": m.get("content") or ""}
