"""The pages of `hubgym view`: a Starlette app over a RunStore, rendered by Jinja2 with autoescape on.

    /                                   every run: per-env table and reward histograms
    /run/{run}/rollouts?env=&...&sort=&page=  a run's rollouts, filtered and sorted, one page at a time
    /run/{run}/rollout/{rollout_id}     one trajectory: messages, tool calls, step rewards, components, tokens
    /compare?a=0&b=1&page=              two runs (any two, from a picker) on the tasks both sampled, largest
                                        reward difference first
    /compare/task?a=0&b=1&env=&task=    one task's first sample in each run, side by side

Stored data is untrusted: every value reaches the page through an autoescaping template (no `|safe` on data), and
the Content-Security-Policy allows only this server's own stylesheet: no script runs, nothing is fetched elsewhere.
Requests are untrusted too: a run index that is not a plain decimal number below the number of runs, a rollout the
run lacks or a path no route has is a 404 page; a request whose Host is not an address the viewer serves is a 400
(hosts.py: DNS rebinding); a 500 page means the server failed (a shard gone since it was indexed), never a
request's fault.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from hubgym.viewer import queries, trajectory
from hubgym.viewer.hosts import LOOPBACK, HostCheck
from hubgym.viewer.store import RunStore

HERE = Path(__file__).parent
CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; "
       "frame-ancestors 'none'")


def make_app(store: RunStore, decode: trajectory.Decode | None = None, page_rows: int = queries.PAGE_ROWS,
             hosts: frozenset[str] = LOOPBACK) -> Starlette:
    """The app; `decode` turns token ids into text (a tokenizer the user named), else ids are shown; `page_rows`
    rows make one page of a table; `hosts`: the Host names a request may carry (hosts.served_names)."""
    templates = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                                   autoescape=True, undefined=jinja2.StrictUndefined)
    templates.filters["num"] = _num
    templates.filters["pct"] = _pct

    def render(name: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = templates.get_template(name).render(runs=store.runs, **context)
        return HTMLResponse(html, status_code=status, headers={"Content-Security-Policy": CSP,
                                                               "X-Content-Type-Options": "nosniff"})

    def missing(what: str) -> HTMLResponse:
        return render("missing.html", status=404, what=what)

    def bad(what: str) -> HTMLResponse:
        return render("bad_request.html", status=400, what=what)

    def run_of(request: Request, key: str = "run") -> int | None:
        """A run's index from the path or query: ASCII digits only ('²' and '٣' are digits to str.isdigit, not to
        int), at most 9 of them, below the number of runs; else None (a 404 page)."""
        raw = str(request.path_params.get(key, request.query_params.get(key, "")))
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
            return None
        return int(raw) if int(raw) < len(store.runs) else None

    async def overview(request: Request) -> Response:
        summaries = []
        for i, run in enumerate(store.runs):
            envs = queries.env_table(run.index)
            hists = {e["env"]: queries.histogram(run.index, e["env"]) for e in envs}
            new_hists = {e["env"]: queries.histogram(run.index, e["env"], "rescore_reward") for e in envs} \
                if run.rescored else {}
            summaries.append({"i": i, "run": run, "envs": envs, "hists": hists, "new_hists": new_hists})
        return render("index.html", summaries=summaries)

    async def rollouts(request: Request) -> Response:
        i = run_of(request)
        if i is None:
            return missing(f"run {request.path_params['run']}")
        run = store.runs[i]
        filters = queries.Filters.from_query(dict(request.query_params))
        number = _page(request)
        if number is None:
            return bad(f"page {request.query_params['page'][:40]!r} is not a page number (0, 1, 2, ...)")
        rows, matching, pages = queries.page(run.index, filters, number, page_rows)
        return render("rollouts.html", i=i, run=run, rows=rows, matching=matching, pages=pages,
                      number=min(max(number, 0), pages - 1), filters=filters, query=filters.query(),
                      envs=queries.choices(run.index, "env"), finishes=queries.choices(run.index, "finish_reason"))

    async def rollout(request: Request) -> Response:
        i = run_of(request)
        if i is None:
            return missing(f"run {request.path_params['run']}")
        row = store.row(i, request.path_params["rollout_id"])
        if row is None:
            return missing(f"rollout {request.path_params['rollout_id']} in run {store.runs[i].label}")
        return render("rollout.html", i=i, run=store.runs[i], row=row, messages=trajectory.messages(row),
                      components=trajectory.components(row), tokens=trajectory.tokens(row, decode),
                      decoded=decode is not None, info=trajectory.info_text(row), scale=trajectory.SCALE)

    async def compare(request: Request) -> Response:
        a, b = run_of(request, "a"), run_of(request, "b")
        if a is None or b is None:
            return render("compare_pick.html")
        number = _page(request)
        if number is None:
            return bad(f"page {request.query_params['page'][:40]!r} is not a page number (0, 1, 2, ...)")
        rows, matching, pages = queries.compare(store.runs[a].index, store.runs[b].index, number, page_rows)
        return render("compare.html", a=a, b=b, rows=rows, matching=matching, pages=pages,
                      number=min(max(number, 0), pages - 1))

    async def compare_task(request: Request) -> Response:
        a, b = run_of(request, "a"), run_of(request, "b")
        env, task = request.query_params.get("env", ""), request.query_params.get("task", "")
        if a is None or b is None:
            return render("compare_pick.html")
        sides = []
        for i in (a, b):
            rollout_id = queries.first_sample(store.runs[i].index, env, task)
            row = store.row(i, rollout_id) if rollout_id is not None else None
            sides.append({"i": i, "run": store.runs[i], "row": row,
                          "messages": trajectory.messages(row) if row else [],
                          "components": trajectory.components(row) if row else []})
        return render("compare_task.html", a=a, b=b, env=env, task=task, sides=sides)

    async def failed(request: Request, exc: Exception) -> Response:
        """A row the page cannot show (a hand-made shard, say) is one line naming the problem, not a traceback."""
        return render("error.html", status=500, what=f"{request.url.path}: {type(exc).__name__}: {str(exc)[:300]}")

    routes = [Route("/", overview), Route("/run/{run}/rollouts", rollouts),
              Route("/run/{run}/rollout/{rollout_id:path}", rollout), Route("/compare", compare),
              Route("/compare/task", compare_task),
              Mount("/static", StaticFiles(directory=HERE / "static"), name="static")]
    return Starlette(routes=routes, exception_handlers={Exception: failed},
                     middleware=[Middleware(HostCheck, names=hosts)])


def _page(request: Request) -> int | None:
    """The `page` a query asks for (0 when it asks none), or None when it is not ASCII digits (at most 9)."""
    text = request.query_params.get("page") or "0"
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else None


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"
