"""Broken on purpose: step adds a hint drawn from the unseeded global random generator.

Task:
    Guess a number from 1 to 20, one guess per turn inside <guess></guess>.
Row schema:
    info = {"target": int, "max_guesses": int}; interaction multi_turn, max_turns = max_guesses.
Reward:
    The step that finds the number earns 1.0; every other step 0.0. Total in [0, 1].
Arguments:
    config default; TaskConfig.seed and TaskConfig.sizes.
Version history:
    v1: first release.
"""

import random

from hubgym import TaskBuilder, TaskConfig, interaction, make_task, system

MAX_GUESSES = 5


class Guess(TaskBuilder):
    __doc__ = __doc__
    ENV = "nondeterministic_step"
    KIND = "multi_turn"
    VERIFIER = "verifier.py"
    GOLDEN = "golden.jsonl"
    BUILDER_CONFIGS = [TaskConfig(name="default", sizes={"train": 10, "test": 4})]

    def generate_tasks(self, split, size, seed):
        prompt = [system("Guess my number from 1 to 20. Reply with one guess per turn inside <guess></guess>.")]
        for target in random.Random(seed).sample(range(1, 15) if split == "train" else range(15, 21), size):
            yield make_task(self.ENV, prompt, {"target": target, "max_guesses": MAX_GUESSES},
                            interaction("multi_turn", max_turns=MAX_GUESSES))
