"""vLLM's log level: ERROR unless asked otherwise, so its INFO and WARNING blocks and its weight-loading bar
(one each per engine start and per weight sync: a hundred in the demo) do not flood hubgym's own output.

vLLM reads VLLM_LOGGING_LEVEL when it is first imported, and its engine core runs in a spawned process
that inherits the environment; so the level is set in os.environ before vLLM is imported
(`apply_vllm_log_level`, called by the engines) and both processes follow it. A level the user
exported wins; `--verbose` (`set_verbose`) brings the INFO lines back.

    set_verbose(True)        # the CLI's --verbose: vLLM logs at INFO
    apply_vllm_log_level()   # before `import vllm`: ERROR unless set otherwise
    vllm_verbose()           # INFO or DEBUG: the engines show vLLM's weight-loading bar too
"""

from __future__ import annotations

import logging
import os
import sys

DEFAULT_LEVEL = "ERROR"
VERBOSE_LEVEL = "INFO"


def set_verbose(verbose: bool) -> None:
    """The CLI's --verbose: vLLM logs at INFO (a DEBUG level the user exported is kept)."""
    if verbose and os.environ.get("VLLM_LOGGING_LEVEL", "").upper() != "DEBUG":
        os.environ["VLLM_LOGGING_LEVEL"] = VERBOSE_LEVEL
    apply_vllm_log_level()


def apply_vllm_log_level() -> None:
    """Set vLLM's level (default ERROR) for this process and the engine processes it spawns."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", DEFAULT_LEVEL)
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")  # vLLM applies the level to its own handler
    if "vllm" in sys.modules:  # imported already (by the caller's own code): its loggers follow now
        logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"].upper())


def vllm_verbose() -> bool:
    """Whether vLLM logs at INFO or DEBUG (--verbose, or the user's own level)."""
    return os.environ.get("VLLM_LOGGING_LEVEL", DEFAULT_LEVEL).upper() in ("INFO", "DEBUG")
