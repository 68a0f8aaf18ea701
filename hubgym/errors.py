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


class ToolNotFoundError(HubgymError, LookupError):
    """An interaction spec names a tool the registry does not know."""


class SandboxUnavailableError(HubgymError, RuntimeError):
    """Code-running tools need bubblewrap and it is not installed."""


class ImpureVerifierError(HubgymError, RuntimeError):
    """A verifier touched the network or the filesystem while scoring (raised inside the guard)."""
