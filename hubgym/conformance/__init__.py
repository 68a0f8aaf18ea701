"""Conformance: the checks every environment must pass (`hubgym check`, and a pytest plugin)."""
