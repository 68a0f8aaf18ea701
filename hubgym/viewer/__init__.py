"""`hubgym view`: a local page over stored runs and hub runs (per-env tables, reward histograms, filters, one
trajectory at a time with its token record, re-scored rewards, two runs side by side).

    store = RunStore.open(["runs/r1", "org/rollouts@abc123:r1"])
    serve(store, port=8765)                      # blocks; or make_app(store) for any ASGI server

The store keeps a small index of every run (see `store`); rows are read from their shard when a page opens them.
"""

from __future__ import annotations

from hubgym.viewer.app import make_app
from hubgym.viewer.store import Run, RunStore
from hubgym.viewer.trajectory import tokenizer_decoder

__all__ = ["Run", "RunStore", "make_app", "serve", "tokenizer_decoder"]


def serve(store: RunStore, *, host: str = "127.0.0.1", port: int = 8765, decode=None,
          allow_hosts: tuple[str, ...] = ()) -> None:
    """Serve the pages with uvicorn until interrupted (loopback only by default: the page shows stored data); only
    requests naming the address served (or `allow_hosts`) in their Host header are answered (hosts.py)."""
    import uvicorn

    from hubgym.viewer.hosts import served_names

    uvicorn.run(make_app(store, decode, hosts=served_names(host, allow_hosts)), host=host, port=port,
                log_level="warning")
