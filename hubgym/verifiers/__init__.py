"""Verifiers: the contract (pure reward functions, reset/step for MDPs), golden cases, shared reward helpers,
and one pure module per built-in env."""

from hubgym.verifiers.contract import Episode, Score, Step, Verifier, actions_of, load_verifier
from hubgym.verifiers.golden import GoldenCase, load_golden

__all__ = ["Episode", "GoldenCase", "Score", "Step", "Verifier", "actions_of", "load_golden", "load_verifier"]
