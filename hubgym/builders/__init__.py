"""Builders: TaskBuilder (a datasets GeneratorBasedBuilder), the env registry, and one module per built-in env."""

from hubgym.builders.base import TaskBuilder, TaskConfig, split_seed
from hubgym.builders.build import build_files, build_tasks, make_builder
from hubgym.builders.registry import BUILTIN_ENVS, env_names, resolve_env

__all__ = ["BUILTIN_ENVS", "TaskBuilder", "TaskConfig", "build_files", "build_tasks", "env_names", "make_builder",
           "resolve_env", "split_seed"]
