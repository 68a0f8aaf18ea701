"""The typer app every command registers on, and what all commands share: the console and one-line errors.

User errors (an unknown env, a bad name, a builder that breaks the contract, a bad stored file) print
one red message and exit with code 1; a traceback means a bug in hubgym or in the env's code.
"""

from __future__ import annotations

import errno
import functools
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Callable, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from hubgym.errors import HubgymError, error_text

app = typer.Typer(name="hubgym", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="RL environments for language models as plain data: build, check, push, sample, score, train.")

HUB_HELP = "'hf', a Hub-API URL, or a local hub folder [default: $HUBGYM_HUB, else ~/.cache/hubgym/hub]"
Verbose = Annotated[bool, typer.Option("--verbose", help="show vLLM's INFO log lines (hidden by default: vLLM logs "
                                                         "at WARNING unless VLLM_LOGGING_LEVEL says otherwise)")]


def console(stderr: bool = False) -> Console:
    """A console on the current stream; piped output (CI logs, files) renders 160 wide instead of rich's 80."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 160
    return Console(stderr=stderr, width=width)


def fail(message: str) -> NoReturn:
    """One red line (its control characters escaped: a message may quote stored data), exit code 1."""
    from hubgym.schemas.text import plain

    console(stderr=True).print(Text.assemble(("error: ", "bold red"), (plain(message), "red")), soft_wrap=True)
    raise typer.Exit(1)


def user_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Show hubgym errors and failed dataset builds (with the builder's own error) as one red line."""
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except Exception as exc:
            if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG and not isinstance(exc, HubgymError):
                fail(f"{exc.filename!s:.80}...: the name is too long for this system (each part of a path may hold "
                     f"{_name_max()} bytes); give a shorter path, repo id or revision")
            if not isinstance(exc, HubgymError) and not _failed_dataset_build(exc):
                raise
            fail(error_text(exc))
    return run


def _name_max() -> int:
    try:
        return os.pathconf(".", "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _failed_dataset_build(exc: Exception) -> bool:
    """A datasets build error (datasets is imported only by commands that build: if it is not loaded, it is not one)."""
    errors = sys.modules.get("datasets.exceptions")
    return errors is not None and isinstance(exc, errors.DatasetGenerationError)


@app.callback()
def _quiet_datasets() -> None:
    """datasets' own progress bars and logs would interleave with ours (set without importing datasets: commands
    that list or read only never load it). A wait on one of its cache locks longer than a few seconds names the
    lock and its holder (hubgym.files.locks)."""
    from hubgym.files.locks import library_lock_notes

    library_lock_notes()
    if "datasets" in sys.modules:
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
    else:
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("DATASETS_VERBOSITY", "error")


SKIP_BAD_HELP = "leave out shards that fail their checks (each is named) instead of stopping at the first"


@contextmanager
def skipped_shards_noted() -> Iterator[None]:
    """Print the shards a `skip_bad` read left out as yellow notes, also before an error when every one was bad."""
    from hubgym.schemas.text import plain
    from hubgym.errors import SkippedShardsWarning

    with warnings.catch_warnings(record=True) as skipped:
        warnings.simplefilter("always", SkippedShardsWarning)
        try:
            yield
        finally:
            for warning in (w for w in skipped if issubclass(w.category, SkippedShardsWarning)):
                console(stderr=True).print(Text(f"note: {plain(str(warning.message))}", style="yellow"))
