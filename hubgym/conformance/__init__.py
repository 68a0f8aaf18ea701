"""Conformance: the checks every environment must pass (`hubgym check ENV`, and a pytest plugin).

    from hubgym.conformance import check_env, assert_env_ok
    for result in check_env("arithmetic"):
        print(result.check, result.ok, result.message)
    assert_env_ok("./my_env")   # raises the first failure as EnvContractError

The checks (CHECKS, in order) are small named functions; a failure says what went wrong and its
likely cause, where (env, config, split, row id, field), and how to fix it. When a prerequisite
fails (the verifier does not load, a config does not build), the checks that need it are
reported as failed with the message "<check>: skipped: needs ..., which failed in <check>".

Names load on first use: pytest imports the plugin module (hubgym.conformance.pytest_plugin) in
every session, and that must not import datasets.
"""

from __future__ import annotations

from hubgym.files.lazy import lazy_attributes

_EXPORTS: dict[str, str] = {
    "CHECKS": "hubgym.conformance.checks",
    "CheckResult": "hubgym.conformance.runner", "CheckSkipped": "hubgym.conformance.common",
    "assert_env_ok": "hubgym.conformance.runner", "check_env": "hubgym.conformance.runner",
    "iter_checks": "hubgym.conformance.runner", "Only": "hubgym.conformance.context",
    "Violation": "hubgym.conformance.purity", "purity_guard": "hubgym.conformance.purity",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_attributes(__name__, _EXPORTS)
