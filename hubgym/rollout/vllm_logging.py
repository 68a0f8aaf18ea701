"""vLLM's log level: WARNING unless asked otherwise, so its INFO blocks (one per engine start and per weight
sync) do not flood hubgym's own output.

vLLM reads VLLM_LOGGING_LEVEL when it is first imported, and its engine core runs in a spawned process
that inherits the environment; so the level is set in os.environ before vLLM is imported
(`apply_vllm_log_level`, called by the engines) and both processes follow it. A level the user
exported wins; `--verbose` (`set_verbose`) brings the INFO lines back.

    set_verbose(True)        # the CLI's --verbose: vLLM logs at INFO
    apply_vllm_log_level()   # before `import vllm`: WARNING unless set otherwise
"""

from __future__ import annotations

import logging
import os
import sys

DEFAULT_LEVEL = "WARNING"
VERBOSE_LEVEL = "INFO"


def set_verbose(verbose: bool) -> None:
    """The CLI's --verbose: vLLM logs at INFO (a DEBUG level the user exported is kept)."""
    if verbose and os.environ.get("VLLM_LOGGING_LEVEL", "").upper() != "DEBUG":
        os.environ["VLLM_LOGGING_LEVEL"] = VERBOSE_LEVEL
    apply_vllm_log_level()


def apply_vllm_log_level() -> None:
    """Set vLLM's level (default WARNING) for this process and the engine processes it spawns."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", DEFAULT_LEVEL)
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")  # vLLM applies the level to its own handler
    if "vllm" in sys.modules:  # imported already (by the caller's own code): its loggers follow now
        logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"].upper())
