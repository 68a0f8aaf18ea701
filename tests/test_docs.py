"""Every example in README.md and docs/ runs as printed, or says beside it why it does not.

Sybil reads each page's fenced blocks and `<!-- skip: next "reason" -->` directives; a page's blocks run in order in a
fresh folder of their own, with a private local hub (HUBGYM_HUB):

- ```python runs (in this process; in a fresh one when it needs torch, TRL or vLLM, as a script does);
- ```bash runs under `bash -euo pipefail`, with hubgym's own commands on PATH;
- a block with `title="PATH"` is a file: it is written to PATH for the blocks after it (Python is compiled first);
- yaml, toml, json and jsonl blocks without a title must parse;
- `<!-- skip: next "reason" -->` leaves the next block out, and the reason is this file's skip message.

A page with a shell block, or one that starts torch, runs in the slow tier. Every fence names its language, so no
shell block can go unchecked; text and console output blocks are `text`.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from unittest import SkipTest

import pytest
import yaml
from sybil import Region, Sybil
from sybil.evaluators.skip import Skipper
from sybil.parsers.abstract.lexers import LexerCollection
from sybil.parsers.markdown import SkipParser
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
RUN = {"python", "bash"}
DATA = {"yaml", "toml", "json", "jsonl"}
SHOWN = {"text", "markdown", "ini", "jinja"}  # output and other text, never run
HEAVY = re.compile(r"^\s*(?:from|import)\s+(?:trl|transformers|torch|vllm|deepspeed)\b|run_rollouts|__main__", re.M)
BLOCK_TIMEOUT_S = 900


class Block:
    """One fenced block: language, optional file title, its source and where it is."""

    def __init__(self, language: str, title: str | None, source: str, page: Path, line: int):
        self.language, self.title, self.source, self.page, self.line = language, title, source, page, line

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def heavy(self) -> bool:
        return self.language == "bash" or (self.language == "python" and not self.title
                                           and bool(HEAVY.search(self.source)))


class BlockParser:
    """Every fenced block, whatever its language (so none is missed): ```LANG [title="PATH"]."""

    info = re.compile(r'(?P<language>[\w-]*)(?:[ \t]+title="(?P<title>[^"]+)")?[^\n]*$\n', re.M)

    def __init__(self):
        self.lexers = LexerCollection([RawFencedCodeBlockLexer(info_pattern=self.info)])

    def __call__(self, document):
        for lexed in self.lexers(document):
            yield Region(lexed.start, lexed.end, (lexed.lexemes["language"], lexed.lexemes["title"],
                                                  str(lexed.lexemes["source"])), evaluate_block)


def evaluate_block(example) -> None:
    language, title, source = example.parsed
    block = Block(language, title, source, Path(example.path), example.line)
    example.namespace["run"](block)


DOCS = Sybil(parsers=[BlockParser(), SkipParser()], patterns=["*.md"])


def blocks(page: Path) -> list[tuple[Block, str | None]]:
    """The page's blocks, each with the reason it is not run (None: it runs)."""
    out, reason = [], None
    for example in DOCS.parse(page):
        if isinstance(example.region.evaluator, Skipper):
            action, argument = example.parsed
            reason = ast.literal_eval(argument) if action == "next" and argument else ""
            continue
        language, title, source = example.parsed
        out.append((Block(language, title, source, page, example.line), reason))
        reason = None
    return out


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def is_slow(page: Path) -> bool:
    return any(b.heavy for b, reason in blocks(page) if reason is None)


def test_every_fence_names_a_language_and_every_skip_a_reason():
    problems = []
    for page in PAGES:
        for block, reason in blocks(page):
            if block.language not in RUN | DATA | SHOWN:
                problems.append(f"{block.where}: a ```{block.language or ''} fence; name one of "
                                f"{sorted(RUN | DATA | SHOWN)} (shell commands are bash, output is text)")
            if reason == "" or (reason is not None and not isinstance(reason, str)):
                problems.append(f'{block.where}: a skip without its reason: write <!-- skip: next "why" -->')
            if reason is not None and block.language not in RUN:
                problems.append(f"{block.where}: a skip before a ```{block.language} block, which never runs")
    assert problems == []


def test_the_examples_that_are_not_run_say_why():
    """A skip says why (a GPU, a cluster, a long job, a test that runs the same thing), and a test it names exists."""
    skipped = [(b.where, reason) for page in PAGES for b, reason in blocks(page) if reason]
    ran = [b for page in PAGES for b, reason in blocks(page) if reason is None and b.language in RUN]
    assert ran and all(len(reason) > 10 for _, reason in skipped), skipped
    missing = []
    for where, reason in skipped:
        for path, name in re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", reason):
            source = ROOT / path
            if not source.is_file() or (name and not re.search(rf"^def {name}\(", source.read_text(), re.M)):
                missing.append(f"{where}: names {path}{'::' + name if name else ''}, which does not exist")
    assert missing == []


@pytest.mark.parametrize("page", [pytest.param(p, id=page_id(p), marks=[pytest.mark.slow] if is_slow(p) else [])
                                  for p in PAGES if any(r is None and b.language in RUN | DATA for b, r in blocks(p))])
def test_page_examples_run_as_printed(page, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HUBGYM_HUB", str(tmp_path / "hub"))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("COLUMNS", "160")
    runner = Runner(work, tmp_path)
    document = DOCS.parse(page)
    document.namespace["run"] = runner
    skipped = []
    for example in document.examples():
        try:
            example.evaluate()
        except SkipTest as reason:
            skipped.append(str(reason))
    assert runner.ran, f"{page_id(page)}: no example ran"


class Runner:
    """Runs one page's blocks in order in `work`."""

    def __init__(self, work: Path, scratch: Path):
        self.work, self.scratch, self.ran = work, scratch, 0

    def __call__(self, block: Block) -> None:
        started = time.monotonic()
        try:
            self.run(block)
        finally:
            print(f"{block.where}: {block.language} {time.monotonic() - started:.1f} s")

    def run(self, block: Block) -> None:
        if block.title:
            return self.write(block)
        if block.language == "python":
            self.python(block)
        elif block.language == "bash":
            self.shell(["bash", "-euo", "pipefail", "-c", block.source], block)
        elif block.language in DATA:
            parse(block)
        self.ran += 1

    def write(self, block: Block) -> None:
        path = self.work / block.title
        if block.language == "python":
            compile(block.source, block.where, "exec")
        elif block.language in DATA:
            parse(block)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.source)

    def python(self, block: Block) -> None:
        if block.heavy:  # a script of its own: torch, TRL and vLLM load in a fresh process, as a user's script does
            script = self.scratch / f"example_{block.line}.py"
            script.write_text(block.source)
            return self.shell([sys.executable, str(script)], block)
        exec(compile(block.source, block.where, "exec"), {"__name__": "docs_example"})

    def shell(self, command: list[str], block: Block) -> None:
        """Run `command` in its own session; whatever it left running (a server started with `&`) is stopped after."""
        process = subprocess.Popen(command, cwd=self.work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, start_new_session=True)
        try:
            output, _ = process.communicate(timeout=BLOCK_TIMEOUT_S)
        finally:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            process.wait()
        assert process.returncode == 0, f"{block.where} failed (exit {process.returncode}):\n{output[-6000:]}"


def parse(block: Block) -> None:
    if block.language == "yaml":
        yaml.safe_load(block.source)
    elif block.language == "toml":
        tomllib.loads(block.source)
    elif block.language == "json":
        json.loads(block.source)
    elif block.language == "jsonl":
        for line in block.source.splitlines():
            json.loads(line)
