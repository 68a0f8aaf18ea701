"""vLLM's log level: ERROR unless the user sets one, INFO with `--verbose`. That a real rollout through the installed
command shows no vLLM line by default (in this process and in vLLM's engine processes) and shows them with
`--verbose` is proven by tests/test_rollout_kill.py, on the two runs it makes anyway."""

import os

from hubgym.engines.vllm_logging import apply_vllm_log_level, set_verbose


def test_the_level_is_error_by_default_and_a_users_level_wins(monkeypatch):
    for name in ("VLLM_LOGGING_LEVEL", "VLLM_CONFIGURE_LOGGING"):
        monkeypatch.delenv(name, raising=False)
    apply_vllm_log_level()
    assert (os.environ["VLLM_LOGGING_LEVEL"], os.environ["VLLM_CONFIGURE_LOGGING"]) == ("ERROR", "1")
    set_verbose(True)
    assert os.environ["VLLM_LOGGING_LEVEL"] == "INFO"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    set_verbose(True)
    apply_vllm_log_level()
    assert os.environ["VLLM_LOGGING_LEVEL"] == "DEBUG"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "ERROR")
    set_verbose(False)
    assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR"
