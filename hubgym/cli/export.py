"""`hubgym export sft`: stored rollouts as a fine-tuning dataset (hubgym.score.export_sft).

    hubgym export sft runs/r1 --out out/sums-sft --set min_reward=1 --set best_of_group=1
    hubgym export sft org/rollouts@3f1c2e9 --out out/sft --push org/sums-sft --hub hf --rescore
    hubgym export sft --options                      # the selection rules, as train's offline.select has them
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from hubgym.cli.app import HUB_HELP, app, console, user_errors
from hubgym.envs.pins import PIN_HELP, parse_pins

export_app = typer.Typer(no_args_is_help=True, help="Stored rollouts in other forms: `sft`, a fine-tuning dataset.")
app.add_typer(export_app, name="export")


@export_app.command("sft")
@user_errors
def sft(sources: Annotated[Optional[list[str]], typer.Argument(help="run folders, shard files or "
                                                                    "org/name\\[@rev]\\[:RUN]")] = None,
        out: Annotated[Optional[Path], typer.Option(help="the dataset folder to write (replaced whole)")] = None,
        set_: Annotated[Optional[list[str]], typer.Option("--set", help="a selection rule, key=value (see "
                                                                        "--options), e.g. min_reward=1")] = None,
        options: Annotated[bool, typer.Option("--options", help="list the selection rules and exit")] = False,
        rescore: Annotated[bool, typer.Option(help="score the rows with the current verifier (or --verifier / "
                                                   "--env-revision) before selecting")] = False,
        verifier: Annotated[Optional[list[str]], typer.Option(help="with --rescore: \\[ENV=]MODULE, as `hubgym score` "
                                                                   "takes it")] = None,
        env_revision: Annotated[Optional[list[str]], typer.Option(help="with --rescore: org/name@revision of a hub "
                                                                       "env whose verifier scores its rows")] = None,
        push: Annotated[Optional[str], typer.Option(help="also commit the dataset to this hub dataset repo "
                                                         "(org/name)")] = None,
        hub: Annotated[Optional[str], typer.Option(help=HUB_HELP)] = None,
        trust: Annotated[bool, typer.Option(help="run unpinned hub verifiers")] = False,
        pin: Annotated[Optional[list[str]], typer.Option(help=PIN_HELP)] = None) -> None:
    """Write the selected stored rollouts as a `messages` dataset for TRL's SFTTrainer (and push it)."""
    from hubgym.score.select import Selection, selection_from_sets

    if options:
        table = Table("rule", "default", "what it keeps", title="selection rules (--set KEY=VALUE)", box=None)
        for name, field in Selection.model_fields.items():
            table.add_row(name, repr(field.get_default(call_default_factory=True)), field.description or "")
        console().print(table)
        return
    if not sources or out is None:
        raise typer.BadParameter("give SOURCES and --out (or --options to list the selection rules)")
    if (verifier or env_revision) and not rescore:
        raise typer.BadParameter("--verifier and --env-revision choose how --rescore scores the rows; add --rescore")
    from hubgym.app import views
    from hubgym.score.export_sft import export_sft

    choice = None
    if rescore:
        from hubgym.score.choice import VerifierChoice

        choice = VerifierChoice(verifier, env_revision, trust=trust, pin=pin, hub=hub)
    with views.rows_progress(console(stderr=True), "exporting") as advance:
        result = export_sft(sources, out, selection_from_sets(set_ or []), choice=choice, push=push, hub=hub,
                            trust=trust, pins=parse_pins(pin), progress=advance)
    shown = console()
    shown.print(result.plan.table(title="export selection"))
    shown.print(Text(f"wrote {result.rows} examples to {result.out} ({', '.join(result.files)})"))
    if result.pushed:
        shown.print(Text(f"pushed -> {result.pushed}"))
