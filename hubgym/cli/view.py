"""`hubgym view`: a local page over stored runs and hub runs.

    hubgym view runs/r1 runs/r1-rescored org/rollouts@abc123:r1 --tokenizer tiny --port 8765
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.text import Text

from hubgym.app import views
from hubgym.schemas.text import plain
from hubgym.cli.app import HUB_HELP, SKIP_BAD_HELP, app, console, fail, skipped_shards_noted, user_errors


@app.command()
@user_errors
def view(sources: Annotated[list[str], typer.Argument(
             help="run folders, shard files or rollout repos org/name\\[@rev]\\[:RUN] (re-scored runs too)")],
         hub: Annotated[Optional[str], typer.Option(help=HUB_HELP)] = None,
         host: Annotated[str, typer.Option(help="address to listen on (the page shows your data: keep it local)")]
         = "127.0.0.1",
         port: Annotated[int, typer.Option(min=1, max=65535, help="port to listen on")] = 8765,
         tokenizer: Annotated[Optional[str], typer.Option(
             help="model whose tokenizer shows token text (tiny, smollm2-135m, a folder or a Hub id) "
                  "\\[default: token ids]")] = None,
         skip_bad: Annotated[bool, typer.Option(help=SKIP_BAD_HELP)] = False,
         allow_host: Annotated[Optional[list[str]], typer.Option(
             help="a name the page may also be opened by (a proxy's, a tunnel's; repeatable): requests naming any "
                  "other Host than the address served are refused")] = None) -> None:
    """Serve a page over rollouts: per-env tables and reward histograms, filters, one trajectory at a time with its
    token record, re-scored rewards beside the stored ones, two runs side by side. Reads each shard once to index
    it, then opens rows from their shard as pages ask for them."""
    try:
        from hubgym.viewer import RunStore, serve, tokenizer_decoder
    except ImportError as exc:
        fail(f"hubgym view needs {exc.name}: pip install 'hubgym[view]'")

    decode = tokenizer_decoder(tokenizer) if tokenizer else None
    with skipped_shards_noted(), views.rows_progress(console(stderr=True), "indexing rollouts") as advance:
        store = RunStore.open(sources, hub=hub, skip_bad=skip_bad, progress=lambda _, rows: advance(rows, None),
                              vocab_size=decode.vocab_size if decode else None)
    shown = console()
    for run in store.runs:
        shown.print(Text(f"{plain(run.label)}: {run.index.height} rollouts in {len(run.shards)} shard(s)"
                         f"{' (re-scored)' if run.rescored else ''}"))
    shown.print(Text(f"serving http://{host}:{port}/ (Ctrl-C stops)"), soft_wrap=True)
    serve(store, host=host, port=port, decode=decode, allow_hosts=tuple(allow_host or ()))
