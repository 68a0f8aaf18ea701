"""Broken on purpose: its tool raises on every call.

Task:
    Repeat the given word inside <answer></answer>; the `spell` tool (tools.py) may help.
Row schema:
    info = {"word": str}; interaction tool_use, tools [spell], max_turns 3.
Reward:
    correct (weight 1): the answer equals the word. Total in [0, 1].
Arguments:
    config default; TaskConfig.seed and TaskConfig.sizes.
Version history:
    v1: first release.
"""

import random

from hubgym import TaskBuilder, TaskConfig, interaction, make_task, user

WORDS = ["apple", "brick", "cloud", "delta", "eagle", "flute", "grape", "house", "igloo", "jelly", "koala", "lemon",
         "mango", "noble", "ocean", "piano", "quilt", "river", "stone", "tiger"]
SHAPING = []


class Spell(TaskBuilder):
    __doc__ = __doc__
    ENV = "tool_raises"
    KIND = "tool_use"
    TOOLS = ("spell",)
    TOOLS_MODULE = "tools.py"
    VERIFIER = "verifier.py"
    GOLDEN = "golden.jsonl"
    BUILDER_CONFIGS = [TaskConfig(name="default", sizes={"train": 12, "test": 4})]

    def generate_tasks(self, split, size, seed):
        for word in random.Random(seed).sample(WORDS[:14] if split == "train" else WORDS[14:], size):
            spec = interaction("tool_use", max_turns=3, tools=self.TOOLS, tool_rewards=SHAPING)
            yield make_task(self.ENV, [user(f"Repeat the word {word!r} inside <answer></answer>.")], {"word": word},
                            spec)
