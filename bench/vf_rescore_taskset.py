"""A verifiers 0.4 taskset that re-scores hubgym traces offline, for bench/bench_rescore_vf.py: `vf-replay` (verifiers'
own offline re-scoring) runs a Task's `@vf.reward` hooks on each saved trace, and `hubgym_verifiers` records its
rewards while an episode runs (`HubgymEnv.run`), so its Task has none to re-run. This Task's hook does what `run`
does at the end of an episode, from the saved trace alone: the episode's messages (the prompt's, then the replies
and observations on the trace's last branch, then the last observation kept in `info`), whether the last reply was
cut (the last model call's finish reason), and hubgym's verifier recording each component with its weight.

verifiers resolves a taskset id to a module exporting its classes in `__all__` (the bench puts bench/ on the path).
"""

from __future__ import annotations

import json
from functools import cache

import verifiers.v1 as vf

from hubgym.integrations.verifiers_env import HubgymData, HubgymTaskset, HubgymTasksetConfig, record_score
from hubgym.schemas.messages import message, user

__all__ = ["HubgymData", "RescoredTask", "RescoredTaskset", "HubgymTasksetConfig"]  # no Env: verifiers' SingleAgentEnv


@cache
def verifier_of(env: str):
    from hubgym.envs import open_env

    return open_env(env).verifier


class RescoredTask(vf.Task[HubgymData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def hubgym(self, trace) -> dict[str, float]:
        """hubgym's score of the saved episode, each component recorded with its own weight (as `run` does);
        nothing recorded under this hook's own name."""
        row = json.loads(self.data.hubgym_task)
        verifier = verifier_of(row["env"])
        prompt = len(row["prompt"]) + (1 if verifier.multi_turn and verifier.reset(row)[1] else 0)
        trajectory = [message(m.role, m.content if isinstance(m.content, str) else "") for m in trace.messages[prompt:]]
        final = trace.info.get("hubgym_final_observation")
        if final and trajectory and trajectory[-1]["role"] == "assistant":
            trajectory.append(user(final))
        cut = bool(trace.calls) and trace.calls[-1].finish_reason == "length"
        record_score(trace, verifier, row, trajectory, cut)
        return {}


class RescoredTaskset(vf.Taskset[RescoredTask, HubgymTasksetConfig]):
    load = HubgymTaskset.load
