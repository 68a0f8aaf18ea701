"""Broken on purpose: a metric samples the unseeded global random generator.

Task:
    Repeat the given word inside <answer></answer>.
Row schema:
    info = {"word": str}; interaction single_turn, max_turns 1.
Reward:
    correct (weight 1): the answer equals the word. Total in [0, 1].
Arguments:
    config default; TaskConfig.seed and TaskConfig.sizes.
Version history:
    v1: first release.
"""

import random

from hubgym import TaskBuilder, TaskConfig, make_task, user

WORDS = ["apple", "brick", "cloud", "delta", "eagle", "flute", "grape", "house", "igloo", "jelly", "koala", "lemon",
         "mango", "noble", "ocean", "piano", "quilt", "river", "stone", "tiger"]


class Echo(TaskBuilder):
    __doc__ = __doc__
    ENV = "random_metric"
    VERIFIER = "verifier.py"
    GOLDEN = "golden.jsonl"
    BUILDER_CONFIGS = [TaskConfig(name="default", sizes={"train": 12, "test": 4})]

    def generate_tasks(self, split, size, seed):
        for word in random.Random(seed).sample(WORDS[:14] if split == "train" else WORDS[14:], size):
            yield make_task(self.ENV, [user(f"Repeat the word {word!r} inside <answer></answer>.")], {"word": word})
