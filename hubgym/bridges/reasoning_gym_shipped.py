"""What the reasoning-gym bridge ships beside its code, written by its probe (hubgym.bridges.reasoning_gym_probe):
the catalog index, the specs of every bridged generator (configs, sizes, exclusions) and the golden cases.

    load_specs()["envs"]["rg_basic_arithmetic"]["configs"]      # read once per process
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
INDEX = HERE / "reasoning_gym_index.json"  # FamilyEnv rows (hubgym.builders.families format)
SPECS = HERE / "reasoning_gym_specs.json"  # per env: generator, config fields, sizes; EXCLUDED; dropped configs
GOLDEN_DIR = HERE / "golden"


@cache
def load_specs() -> dict[str, Any]:
    """The shipped specs: {"version", "envs": {env: spec}, "excluded": {generator: reason}, "dropped_configs"}."""
    return json.loads(SPECS.read_text())
