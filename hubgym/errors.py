"""Every exception hubgym raises, in one module.

Each error subclasses a standard exception (so `except ValueError` still works), carries
structured fields, and pickles across processes. Errors about an environment name *where*
the problem is (env, config, split, row id, field) and say *how to fix it*.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Where:
    """Where in an environment a problem sits; every field is optional."""

    env: str | None = None
    config: str | None = None
    split: str | None = None
    row: str | None = None
    field: str | None = None

    def __str__(self) -> str:
        parts = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if getattr(self, f.name) is not None]
        return " ".join(parts) if parts else "(no location)"


class HubgymError(Exception):
    """Base class. Subclasses keep their constructor arguments so they pickle."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args)
        self._kwargs = kwargs

    def __reduce__(self):
        return (_rebuild, (type(self), self.args, self._kwargs))


def _rebuild(cls, args, kwargs):
    return cls(*args, **kwargs)


class EnvContractError(HubgymError, ValueError):
    """An environment broke the contract: a bad row, a bad verifier, a golden case that disagrees.

    The message reads: `<what> [<where>]. Fix: <fix>`.
    """

    def __init__(self, what: str, where: Where | None = None, fix: str = "", check: str | None = None):
        self.what, self.where, self.fix, self.check = what, where or Where(), fix, check
        prefix = f"{check}: " if check else ""
        message = f"{prefix}{what} [{self.where}]"
        if fix:
            message += f". Fix: {fix}"
        super().__init__(message, where=self.where, fix=fix, check=check)

    def __reduce__(self):
        return (_rebuild, (type(self), (self.what,), {"where": self.where, "fix": self.fix, "check": self.check}))


class SchemaError(EnvContractError):
    """A row or table does not match a hubgym schema."""


class VerifierLoadError(EnvContractError):
    """A verifier module is missing required functions or declares them wrongly."""


class EnvNotFoundError(HubgymError, LookupError):
    """No environment is registered under a name, entry point or path."""


class StoredEnvError(EnvNotFoundError):
    """Stored rows name an env no verifier was chosen for (stored data never chooses code); `env` is the name."""

    def __init__(self, message: str, env: str | None = None):
        self.env = env
        super().__init__(message, env=env)


class ToolNotFoundError(HubgymError, LookupError):
    """An interaction spec names a tool the registry does not know."""


class SandboxUnavailableError(HubgymError, RuntimeError):
    """Code-running tools need bubblewrap and it is not installed."""


class ImpureVerifierError(HubgymError, RuntimeError):
    """A verifier touched the network or the filesystem while scoring (raised inside the guard)."""


class VerifierNotTrustedError(HubgymError, PermissionError):
    """A hub env's verifier was not run: its sha256 matches no pin and trust was not given.

    Verifier code from a repo is code from someone else; it runs only when its sha256 equals a
    pin the user gave (or the user passes trust=True). The message shows the actual sha256 and
    how to pin it. Nothing from the module has been executed when this is raised.
    """

    def __init__(self, message: str, repo: str | None = None, revision: str | None = None,
                 sha256: str | None = None, pinned: str | None = None):
        self.repo, self.revision, self.sha256, self.pinned = repo, revision, sha256, pinned
        super().__init__(message, repo=repo, revision=revision, sha256=sha256, pinned=pinned)


class HubAuthError(HubgymError, PermissionError):
    """The hub refused a request for want of (valid) credentials. The token itself is never shown."""


class HubConnectionError(HubgymError, ConnectionError):
    """The hub could not be reached, or kept dropping the connection, after retries."""


class EngineError(HubgymError, RuntimeError):
    """The engine failed for every request (unreachable server, dead engine): the run stops, resumable."""


class RolloutsStopped(HubgymError, RuntimeError):
    """Rollouts in flight were cancelled because the run is stopping (Ctrl-C, close); nothing of them is stored."""


class RequestError(HubgymError, RuntimeError):
    """One generation request failed (e.g. the prompt is too long); recorded on its rows, the run goes on."""


class WeightSyncError(HubgymError, ValueError):
    """Weights handed to the vLLM engine do not fit its model (unknown or missing names, other shapes); refused
    before the engine saw them, so it still serves the previous weights."""


class NoShardsError(HubgymError, FileNotFoundError):
    """No rollout shards where some were expected."""


class RescoreError(HubgymError, ValueError):
    """Re-scoring was asked for something it cannot do (a verifier that names no env for rows of several
    envs, an output folder that is one of the sources); the message says how to fix it."""


class SelectionError(HubgymError, ValueError):
    """A selection of stored rollouts (train `offline.select`, `hubgym export sft`) keeps nothing, or keeps rows the
    objective cannot learn from; the message names the selection and the fix."""


class RolloutNotFoundError(HubgymError, LookupError):
    """A rollout id asked for (e.g. `hubgym replay --rollout ID`) is in none of the rows read."""


class ShardError(HubgymError, ValueError):
    """A rollout shard that is truncated, corrupted (its sha256 differs from the recorded one), not a rollout
    table, or holding a row that breaks the row contract (hubgym.schemas.row_contract). `shard` names it (a repo
    path such as RUN/shards/w000of001-00000.arrow, or a file); `column`, `row` (its number in the shard) and `rule`
    say what broke, when one row did. Nothing of the shard was used."""

    def __init__(self, message: str, shard: str | None = None, column: str | None = None, row: int | None = None,
                 rule: str | None = None):
        self.shard, self.column, self.row, self.rule = shard, column, row, rule
        super().__init__(message, shard=shard, column=column, row=row, rule=rule)


class RowContractError(HubgymError, ValueError):
    """Rows handed to the shard writer break the row contract (hubgym.schemas.row_contract): what every reader would
    refuse is never stored. `column`, `row` (its place among the rows written), `rule` and `rollout_id` say which;
    nothing was written. A bug in the code that made the rows (an import, a custom loop), not in stored data."""

    def __init__(self, message: str, column: str | None = None, row: int | None = None, rule: str | None = None,
                 rollout_id: str | None = None):
        self.column, self.row, self.rule, self.rollout_id = column, row, rule, rollout_id
        super().__init__(message, column=column, row=row, rule=rule, rollout_id=rollout_id)


class ManifestError(HubgymError, ValueError):
    """A stored file beside the shards is not what hubgym wrote: a run's manifest-*.json, or a rollout repo's
    index.json or summary.json (not UTF-8, not JSON, a field missing or of the wrong type). `path` names it; the
    message says what is wrong and how to fix it. Nothing it records was used."""

    def __init__(self, message: str, path: str | None = None):
        self.path = path
        super().__init__(message, path=path)


class ModelNotFoundError(HubgymError, FileNotFoundError):
    """A model setting (`--model`, a training config's `model`) names no model folder here and no model on the
    Hub; `setting` and `model` say which and what was given, the message how to fix it."""

    def __init__(self, message: str, setting: str | None = None, model: str | None = None):
        self.setting, self.model = setting, model
        super().__init__(message, setting=setting, model=model)


class ContextLengthError(HubgymError, ValueError):
    """A context length (`--max-model-len`) past the model's own limit (max_position_embeddings): both named."""

    def __init__(self, message: str, asked: int | None = None, limit: int | None = None):
        self.asked, self.limit = asked, limit
        super().__init__(message, asked=asked, limit=limit)


class SettingError(HubgymError, ValueError):
    """A setting outside what it can mean (NaN, infinity, a negative temperature, an unknown key); `setting` names
    it and the message gives the value and the fix."""

    def __init__(self, message: str, setting: str | None = None):
        self.setting = setting
        super().__init__(message, setting=setting)


class NonFiniteTrainingError(HubgymError, ArithmeticError):
    """Training reached a number that is not finite (a loss, a gradient norm or a weight): the run stopped before
    that step was checkpointed, synced into vLLM or exported, and `step` says where; the message says what to
    change (the learning rate, clipping, the data) before resuming from the last checkpoint."""

    def __init__(self, message: str, step: int | None = None):
        self.step = step
        super().__init__(message, step=step)


class SkippedShardsWarning(UserWarning):
    """Bad shards were skipped (`skip_bad=True`): the message counts and names them; the other shards were read."""


class BadRowError(HubgymError, ValueError):
    """A rollout row (or group) the trainer cannot use, raised in strict mode; names env, rollout id and field.

    Outside strict mode such rows are skipped and counted instead (`GroupStream.counts`).
    """

    def __init__(self, message: str, env: str | None = None, rollout_id: str | None = None,
                 field: str | None = None):
        self.env, self.rollout_id, self.field = env, rollout_id, field
        super().__init__(message, env=env, rollout_id=rollout_id, field=field)


class SequenceTooLongError(HubgymError, ValueError):
    """One sequence (prompt + completion) is longer than the micro-batch token budget, so it fits in none."""


class RunFolderError(HubgymError, RuntimeError):
    """A run folder cannot be written by this process: another live process writes the same part of it (`pid`,
    when known), or it holds another run's rollouts (`run_id`). Nothing was written; the message says what to do
    (another --out, or wait for the other process)."""

    def __init__(self, message: str, folder: str | None = None, pid: int | None = None, run_id: str | None = None):
        self.folder, self.pid, self.run_id = folder, pid, run_id
        super().__init__(message, folder=folder, pid=pid, run_id=run_id)


class ChatFormatError(HubgymError, ValueError):
    """A chat option a run cannot honour: a tool or reasoning parser vLLM does not know (or that does not fit the
    model's tokenizer), chat template kwargs that are not a JSON object, or an env whose tools the model's chat
    template ignores. `setting` names the option to change."""

    def __init__(self, message: str, setting: str | None = None):
        self.setting = setting
        super().__init__(message, setting=setting)


class ClusterError(HubgymError, RuntimeError):
    """A Ray cluster cannot run (or finish) the work: Ray missing, an address that does not answer, a worker that
    keeps dying, a node that does not see the run folder. `address`, `shard` and `node` say where, when known."""

    def __init__(self, message: str, address: str | None = None, shard: str | None = None, node: str | None = None):
        self.address, self.shard, self.node = address, shard, node
        super().__init__(message, address=address, shard=shard, node=node)


class NodeError(HubgymError, RuntimeError):
    """A multi-node run cannot go on: a rank cannot see the run folder, a node did not join, or a peer died."""

    def __init__(self, message: str, rank: int | None = None, host: str | None = None):
        super().__init__(message, rank=rank, host=host)
        self.rank, self.host = rank, host


class ResultsError(HubgymError, ValueError):
    """Results written by another framework (verifiers' traces.jsonl) that `hubgym import` cannot read: a missing
    file, a line that is not JSON, a field that is missing or of the wrong type. `path` names the file and line."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None):
        self.path, self.line = path, line
        super().__init__(message, path=path, line=line)


class IntegrationError(HubgymError, RuntimeError):
    """hubgym inside another framework cannot do what was asked: a trainer the TRL recorder cannot see the tokens
    of, a recording that failed to write. `framework` names it, `setting` what to change."""

    def __init__(self, message: str, framework: str | None = None, setting: str | None = None):
        self.framework, self.setting = framework, setting
        super().__init__(message, framework=framework, setting=setting)


def error_text(exc: BaseException) -> str:
    """The message of a hubgym error; `Type: message` of anything else. A failed datasets build is reported by
    the builder's own error underneath it (its `__cause__`)."""
    import sys

    build_errors = sys.modules.get("datasets.exceptions")  # datasets is not imported to ask: if absent, not one
    if build_errors is not None and isinstance(exc, build_errors.DatasetGenerationError) and exc.__cause__:
        exc = exc.__cause__
    return str(exc) if isinstance(exc, HubgymError) else f"{type(exc).__name__}: {exc}"
