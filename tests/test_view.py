"""`hubgym view` in a real browser (Debian's chromium driven by Playwright) over small real runs
(tests/helpers/view_runs.py): per-env tables and histograms, filters and paging, trajectories with their token
record and logprobs on hover, re-scored rewards, two runs side by side, a hub run over the loopback Hub API, and
hostile stored HTML shown as text. Screenshots are kept under out/test-view/."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import polars as pl
import pytest

from hubgym.hub.rollout_reader import iter_rollouts
from hubgym.verifiers.contract import stored_step_rewards
from hubgym.viewer import RunStore, make_app, tokenizer_decoder
from hubgym.viewer.store import KEEP_SHARDS

from helpers.view_runs import HOSTILE, make_view_runs

SHOTS = Path(__file__).resolve().parent.parent / "out" / "test-view"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run"]
PAGE_ROWS = 4  # small pages, so the six-row runs page across their three shards


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory):
    return make_view_runs(tiny_model, tmp_path_factory.mktemp("view-runs"))


@pytest.fixture(scope="module")
def sources(runs):
    return [runs.wordle_a, runs.wordle_b, runs.rescored, runs.tools, runs.hostile]


def rows_of(run) -> pl.DataFrame:
    return pl.DataFrame([{k: r[k] for k in ("rollout_id", "env", "task_id", "reward", "truncated")}
                         | {"rescore_reward": r.get("rescore_reward")} for r in iter_rollouts(run)])


class Served:
    """A view app on a free loopback port, run by uvicorn in a thread."""

    def __init__(self, app):
        import uvicorn

        from hubgym.engines.server import free_port

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def store(sources):
    return RunStore.open([str(s) for s in sources])


@pytest.fixture(scope="module")
def site(store, tiny_model):
    with Served(make_app(store, tokenizer_decoder(str(tiny_model)), page_rows=PAGE_ROWS)) as url:
        yield url


@pytest.fixture(scope="module")
def playwright(runs):
    """Playwright's sync API, which keeps an event loop running in this thread until the module ends: the runs
    (made with asyncio.run) come first, whichever test of the module a worker runs first."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright):
    """Chromium under Playwright."""
    launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    yield launched
    launched.close()


@pytest.fixture
def page(browser, request):
    """A fresh page; its screenshot is kept under out/test-view/<test name>.png."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    opened = context.new_page()
    yield opened
    SHOTS.mkdir(parents=True, exist_ok=True)
    opened.screenshot(path=str(SHOTS / f"{request.node.name}.png"), full_page=True)
    context.close()


def cells(page, selector: str) -> list[str]:
    return [t.strip() for t in page.locator(selector).all_inner_texts()]


# -- the index and queries (no browser) ---------------------------------------------------------------------------

@pytest.mark.slow
def test_the_index_keeps_small_columns_and_rows_come_from_one_shard_at_a_time(store, runs):
    run = store.runs[0]
    assert len(run.shards) == 3 and run.index.height == rows_of(runs.wordle_a).height
    assert not {"prompt", "completion", "completion_ids", "completion_logprobs"} & set(run.index.columns)
    for rollout_id in run.index["rollout_id"]:
        row = store.row(0, rollout_id)
        assert row["rollout_id"] == rollout_id and row["completion_ids"]
        assert len(store._open) <= KEEP_SHARDS  # never the whole run: the last shards read, no more
    assert store.row(0, "no-such-rollout") is None


# -- pages in the browser -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_overview_shows_each_run_per_env_with_reward_histograms(page, site, runs, sources):
    page.goto(site)
    for i, source in enumerate(sources):
        expected = rows_of(source).group_by("env").agg(pl.len().alias("n"), pl.col("reward").mean().alias("mean"))
        section = page.locator(f"#run-{i}")
        for env, n, mean in expected.iter_rows():
            line = section.locator(f"tr.env-row[data-env='{env}']")
            assert line.locator("td").nth(1).inner_text() == str(n)
            assert line.locator("td.mean-reward").inner_text() == f"{mean:.3f}"
            counts = line.locator("figcaption").first.inner_text().rsplit("counts ", 1)[1]
            assert sum(map(int, counts.split())) == n  # every scored row is in one bar
            assert line.locator("svg rect.bar").count() >= 1
    rescored = page.locator("#run-2 tr.env-row").first
    new_mean = rows_of(runs.rescored)["rescore_reward"].mean()
    assert rescored.locator("td.mean-new-reward").inner_text() == f"{new_mean:.3f}"
    assert rescored.locator("figcaption").count() == 2  # stored and re-scored histograms


@pytest.mark.slow
def test_filters_and_paging_list_exactly_the_matching_rollouts(page, site, runs):
    rows = rows_of(runs.wordle_a)
    page.goto(f"{site}/run/0/rollouts")
    seen = []
    while True:
        seen += cells(page, "table.rollouts tr.rollout-row td:first-child")
        if page.locator("a.next").count() == 0:
            break
        page.click("a.next")
    assert seen == rows["rollout_id"].to_list()  # every row once, in shard order, across three shards

    cut = sorted(rows["reward"].to_list())[len(rows) // 2]
    page.goto(f"{site}/run/0/rollouts")
    page.fill("input[name=min_reward]", str(cut))
    page.select_option("select[name=truncated]", "no")
    page.click("form.filters button")
    expected = rows.filter((pl.col("reward") >= cut) & ~pl.col("truncated"))
    assert page.locator("p.matching").inner_text().startswith(f"{expected.height} of {rows.height}")
    shown = [float(v) for v in cells(page, "table.rollouts td.reward")]
    assert shown and all(v >= cut for v in shown)


@pytest.mark.slow
def test_a_multi_turn_trajectory_shows_step_rewards_and_the_token_record_with_logprobs(page, site, store):
    rollout_id = store.runs[0].index["rollout_id"][0]
    row = store.row(0, rollout_id)
    page.goto(f"{site}/run/0/rollout/{rollout_id}")
    assert page.locator(".msg").count() == len(row["prompt"]) + len(row["completion"])
    steps = stored_step_rewards(row["metrics"])
    shown = cells(page, ".msg.completion .step-reward")
    assert shown == [f"{steps[i]:.3f}" for i in sorted(steps)]
    model, env = page.locator(".tokens .tok.model"), page.locator(".tokens .tok.env")
    assert model.count() == sum(row["completion_mask"]) and env.count() == len(row["completion_mask"]) - model.count()
    assert model.count() > 0 and env.count() > 0
    first = row["completion_mask"].index(1)
    token = page.locator(".tokens .tok").nth(first)
    token.hover()
    tip = token.evaluate("e => getComputedStyle(e, '::after').content")
    assert tip == f'"logprob {row["completion_logprobs"][first]:.3f}"'
    assert "".join(page.locator(".tokens .tok").all_text_contents()).startswith(row["completion"][0]["content"])


@pytest.mark.slow
def test_a_tool_use_trajectory_shows_calls_and_results(page, site, store):
    rollout_id = store.runs[3].index["rollout_id"][0]
    row = store.row(3, rollout_id)
    call = next(c for m in row["completion"] for c in (m["tool_calls"] or []))
    page.goto(f"{site}/run/3/rollout/{rollout_id}")
    assert page.locator(".tool-call .tool-name").first.inner_text() == call["name"]
    assert page.locator(".tool-call .call-id").first.inner_text() == call["id"]
    result = next(m for m in row["completion"] if m["role"] == "tool")
    assert page.locator(".msg.tool pre.content").first.inner_text() == result["content"]
    assert page.locator(".msg.completion .step").count() == 0  # no env steps in a tool_use row


@pytest.mark.slow
def test_a_rescored_run_shows_old_and_new_rewards_and_what_changed(page, site, runs, store):
    rows = rows_of(runs.rescored)
    changed = rows.filter((pl.col("reward") - pl.col("rescore_reward")).abs() > 1e-9)
    page.goto(f"{site}/run/2/rollouts?changed=yes")
    assert page.locator("p.matching").inner_text().startswith(f"{changed.height} of {rows.height}")
    rollout_id = changed["rollout_id"][0]
    page.goto(f"{site}/run/2/rollout/{rollout_id}")
    assert page.locator("dd.reward").inner_text() == f"{changed['reward'][0]:.3f}"
    assert page.locator("dd.new-reward").inner_text() == f"{changed['rescore_reward'][0]:.3f}"
    assert "reward/bonus" in cells(page, "table.components tr.changed td:first-child")


@pytest.mark.slow
def test_two_runs_side_by_side_on_the_same_tasks(page, site, runs):
    a, b = rows_of(runs.wordle_a), rows_of(runs.rescored)
    page.goto(f"{site}/compare?a=0&b=2")
    tasks = set(a["task_id"]) & set(b["task_id"])
    assert page.locator("tr.compare-row").count() == min(len(tasks), PAGE_ROWS)
    deltas = [float(d) for d in cells(page, "tr.compare-row td.delta")]
    mean_delta = (b["rescore_reward"] - b["reward"]).mean()
    assert deltas and all(d > 0 for d in deltas) and sum(deltas) / len(deltas) == pytest.approx(mean_delta, abs=2e-3)
    page.click("tr.compare-row a >> nth=0")
    assert page.locator("section.side").count() == 2
    assert all(page.locator("section.side").nth(i).locator(".msg").count() > 0 for i in range(2))


@pytest.mark.slow
def test_rollouts_sort_by_reward_length_and_turns_each_with_a_one_line_preview(page, site, runs):
    rows = list(iter_rollouts(runs.wordle_a))
    by_id = {r["rollout_id"]: r for r in rows}
    page.goto(f"{site}/run/0/rollouts")
    for key, column, value in (("reward", "td.reward", lambda r: r["reward"]),
                               ("tokens", "td.tokens", lambda r: sum(r["completion_mask"])),
                               ("turns", "td.turns", lambda r: r["num_turns"])):
        page.click(f"a.sort-{key}")  # first click: largest first (rewards are shown to 3 places: 6e-4 below)
        assert f"sort=-{key}" in page.url and page.locator(f"a.sort-{key}").inner_text().endswith("\u2193")
        expected = sorted((value(r) for r in rows), reverse=True)[:PAGE_ROWS]
        assert [float(v) for v in cells(page, f"table.rollouts {column}")] == pytest.approx(expected, abs=6e-4)
        page.click(f"a.sort-{key}")  # again: smallest first
        expected = sorted(value(r) for r in rows)[:PAGE_ROWS]
        assert [float(v) for v in cells(page, f"table.rollouts {column}")] == pytest.approx(expected, abs=6e-4)
    page.click("a.next")  # paging keeps the order asked for
    assert "sort=turns" in page.url and "page=1" in page.url
    for line in page.locator("table.rollouts tr.rollout-row").all():
        row = by_id[line.locator("td").first.inner_text()]
        reply = next(m for m in reversed(row["completion"]) if m["role"] == "assistant")
        assert line.locator("td.preview").inner_text() == " ".join((reply["content"] or "").split())[:100]
        assert line.locator("td.tokens").inner_text() == str(sum(row["completion_mask"]))


@pytest.mark.slow
def test_a_trajectory_shows_its_tasks_info_and_shades_each_model_token_by_its_probability(page, site, store):
    import json

    from hubgym.viewer.trajectory import level_of

    rollout_id = store.runs[0].index["rollout_id"][0]
    row = store.row(0, rollout_id)
    page.goto(f"{site}/run/0/rollout/{rollout_id}")
    assert json.loads(page.locator("pre.info").inner_text()) == row["info"] and row["info"]["secret"]
    tokens = page.locator(".tokens .tok")
    for k, (mask, lp) in enumerate(zip(row["completion_mask"], row["completion_logprobs"])):
        classes = tokens.nth(k).get_attribute("class").split()
        assert ("model" in classes) == bool(mask) and ("env" in classes) == (not mask)
        assert [c for c in classes if c.startswith("lp")] == ([f"lp{level_of(lp)}"] if mask else [])
    style = "e => { const s = getComputedStyle(e); return [s.backgroundColor, s.outlineStyle, s.fontStyle]; }"
    scale = [page.locator(f"p.scale .tok.lp{level}").evaluate(style)[0] for level in range(8)]
    assert len(set(scale)) == 8  # every level its own colour, seen without hovering
    env_look = page.locator(".tokens .tok.env").first.evaluate(style)
    model_look = page.locator(".tokens .tok.model").first.evaluate(style)
    assert env_look[1:] == ["dashed", "italic"] and model_look[1:] == ["none", "normal"]


@pytest.mark.slow
def test_any_two_runs_are_compared_from_the_picker(page, site, runs):
    page.goto(site)
    page.click("nav a.compare-link")
    page.select_option("form.picker select[name=a]", "1")
    page.select_option("form.picker select[name=b]", "2")
    page.click("form.picker button")
    assert page.url.endswith("/compare?a=1&b=2")
    assert page.locator("h2").first.inner_text() == f"{runs.wordle_b.name} vs {runs.rescored.name}"
    assert page.locator("form.picker select[name=a]").input_value() == "1"  # the picker shows the pair compared
    tasks = set(rows_of(runs.wordle_b)["task_id"]) & set(rows_of(runs.rescored)["task_id"])
    assert page.locator("tr.compare-row").count() == min(len(tasks), PAGE_ROWS) > 0


@pytest.mark.slow
def test_stored_html_is_shown_as_text_and_never_runs(page, site, store):
    rollout_id = store.runs[4].index["rollout_id"][0]
    response = page.goto(f"{site}/run/4/rollout/{rollout_id}")
    assert "script-src" not in response.headers["content-security-policy"]  # no script source at all
    assert page.locator(".msg pre.content", has_text="window.__pwned").count() == 2
    assert page.locator(".msg pre.content").filter(has_text="<script>").first.inner_text() == HOSTILE
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.locator("main script, main img").count() == 0 and page.locator("b", has_text="bold?").count() == 0


@pytest.mark.slow
def test_a_hub_run_pushed_over_http_is_viewed_shard_by_shard(page, runs, hub_client, tmp_path):
    from hubgym.hub.rollouts import push_rollouts

    pushed = push_rollouts(runs.tools, "org/rollouts", hub=hub_client.url, name="tools")
    store = RunStore.open([pushed.ref], hub=hub_client.url)
    assert store.runs[0].index.height == rows_of(runs.tools).height and len(store.runs[0].shards) == 3
    with Served(make_app(store)) as url:
        page.goto(f"{url}/run/0/rollouts")
        page.click("table.rollouts tr.rollout-row a >> nth=0")
        assert page.locator(".tool-call .tool-name").first.inner_text() == "calculator"
        assert page.locator(".tokens .tok").first.inner_text().startswith("[")  # no tokenizer named: ids
    assert hub_client.count("GET", r"/resolve/") >= 3  # each shard fetched on its own


@pytest.mark.slow
def test_an_unknown_run_or_rollout_is_a_not_found_page(page, site):
    response = page.goto(f"{site}/run/99/rollouts")
    assert response.status == 404 and "run 99" in page.locator("p.missing").inner_text()
    response = page.goto(f"{site}/run/0/rollout/nope")
    assert response.status == 404 and "rollout nope" in page.locator("p.missing").inner_text()
    for run in ("%C2%B2", "%D9%A3", "%FF", "-1", "1e3", "9" * 40):  # '²' and '٣' are digits to str.isdigit
        response = page.goto(f"{site}/run/{run}/rollouts")
        assert response.status == 404 and page.locator("p.missing").count() == 1, run
    response = page.goto(f"{site}/run/0/rollouts?page=%C2%B2")
    assert response.status == 400 and "is not a page number" in page.locator("p.bad-request").inner_text()


@pytest.mark.slow
def test_a_page_of_another_site_that_rebinds_its_name_to_this_machine_is_refused(runs, site, playwright):
    """DNS rebinding, in the browser: chromium resolves rebind.example to 127.0.0.1 (as a rebinding DNS server
    would make it), so a page of that site reaches the viewer as its own origin; the viewer answers it with a 400
    that holds none of the stored data, while the same page by a loopback name is served."""
    port = site.rsplit(":", 1)[1]
    rules = "--host-resolver-rules=MAP rebind.example 127.0.0.1"
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=[*CHROMIUM_ARGS, rules])
    try:
        page = browser.new_page()
        for path in ("/", "/run/0/rollouts", f"/run/0/rollout/{rows_of(runs.wordle_a)['rollout_id'][0]}"):
            response = page.goto(f"http://rebind.example:{port}{path}")
            assert response.status == 400, path
            assert "is not an address this viewer serves" in page.content() and "wordle" not in page.content()
        assert page.goto(f"http://localhost:{port}/").status == 200 and "wordle" in page.content()
    finally:
        browser.close()


# -- the command ----------------------------------------------------------------------------------------------------

def test_view_of_a_missing_run_is_one_red_line(tmp_path):
    from typer.testing import CliRunner

    from hubgym.cli import app

    result = CliRunner().invoke(app, ["view", str(tmp_path / "no-run")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().startswith("error: ") and "\n" not in result.output.strip()
    assert "no-run does not exist" in result.output


@pytest.mark.slow
def test_the_view_command_serves_the_page_until_stopped(runs):
    import os
    import signal
    import subprocess
    import sys

    import httpx

    from hubgym.engines.server import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "hubgym", "view", str(runs.wordle_a), str(runs.tools),
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    try:
        deadline, page = time.monotonic() + 120, None
        while page is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
            except httpx.TransportError:
                time.sleep(0.2)
        assert page is not None and page.status_code == 200, proc.poll()
        assert page.text.count('class="env-row"') == 2
        assert "default-src 'none'" in page.headers["content-security-policy"]
    finally:
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=30)[0]
    assert f"serving http://127.0.0.1:{port}/" in output and "6 rollouts in 3 shard(s)" in output


# -- queries on a small index (no browser) --------------------------------------------------------------------------

def test_filters_from_a_hand_edited_query_ignore_what_they_cannot_read():
    from hubgym.viewer.queries import Filters

    f = Filters.from_query({"env": "", "min_reward": "nan", "max_reward": "x", "truncated": "maybe", "error": "yes"})
    assert f == Filters(error=True) and Filters.from_query(f.query()) == f


def test_histograms_and_env_tables_count_every_scored_row():
    from hubgym.viewer.queries import HIST_BINS, env_table, histogram

    rewards = [0.0, 0.25, 0.25, 1.0, None]
    index = pl.DataFrame({"env": ["a"] * 5 + ["b"], "task_id": ["t1", "t1", "t2", "t2", "t3", "u"],
                          "reward": rewards + [0.5], "error": [None, None, None, None, "KeyError", None],
                          "truncated": [False, True, False, False, False, False], "num_turns": [1, 2, 1, 1, 1, 3]})
    bars = histogram(index, "a")
    assert len(bars) == HIST_BINS and sum(b.count for b in bars) == 4 and max(b.height for b in bars) == 1.0
    assert bars[0].count == 1 and bars[-1].count == 1 and bars[2].count == 2  # 0.25 falls in the third of ten bins
    assert [(b.count, b.height) for b in histogram(index, "b")] == [(1, 1.0)]  # one value: one bar
    table = {row["env"]: row for row in env_table(index)}
    assert table["a"]["rollouts"] == 5 and table["a"]["scored"] == 4 and table["a"]["tasks"] == 3
    assert table["a"]["mean_reward"] == pytest.approx(1.5 / 4) and table["a"]["errors"] == pytest.approx(0.2)


@pytest.mark.slow
def test_odd_stored_values_and_a_shard_gone_after_indexing_give_pages_not_tracebacks(runs, tmp_path):
    import shutil

    import pyarrow as pa
    from starlette.testclient import TestClient

    run = tmp_path / "odd"
    shutil.copytree(runs.wordle_a, run)
    first = min((run / "shards").glob("*.arrow"))
    table = pa.ipc.open_file(str(first)).read_all()
    rows = table.to_pylist()
    rows[0]["metrics"] = [{"name": None, "value": 1.0}] + rows[0]["metrics"]
    rows[1]["reward"] = float("nan")
    for manifest in run.glob("manifest-*.json"):
        manifest.unlink()  # nothing records the edited shard's sha256: it is read with Arrow's full checks
    with pa.ipc.new_file(str(first), table.schema) as writer:
        writer.write_table(pa.Table.from_pylist(rows, schema=table.schema))
    store = RunStore.open([str(run)])
    client = TestClient(make_app(store), base_url="http://127.0.0.1", raise_server_exceptions=False)
    assert client.get("/").status_code == 200
    assert client.get(f"/run/0/rollout/{rows[0]['rollout_id']}").status_code == 200
    last = max((run / "shards").glob("*.arrow"))
    last.unlink()  # gone after the index was made
    gone = store.runs[0].index.filter(pl.col("shard") == len(store.runs[0].shards) - 1)["rollout_id"][0]
    page = client.get(f"/run/0/rollout/{gone}")
    assert page.status_code == 500 and "ShardError" in page.text and last.name in page.text


# -- requests from anyone (no browser) -------------------------------------------------------------------------------

ROUTES = ("/run/{x}/rollouts", "/run/0/rollouts?page={x}", "/run/0/rollouts?env={x}&min_reward={x}&truncated={x}",
          "/run/0/rollout/{x}", "/compare?a={x}&b=0&page={x}", "/compare?a=0&b=0&page={x}",
          "/compare/task?a={x}&b=0&env={x}&task={x}", "/static/{x}", "/{x}")
ODD = ["%C2%B2", "%D9%A3", "%FF%FE", "%00", "..%2F..%2Fetc%2Fpasswd", "-1", "1e3", "0x1", "9" * 5000, "%E2%80%AE",
       "%", "%%", "%G0", "a%2Fb", " ", "%0D%0AX-Injected:%201", "<script>", "1.5", "inf", "nan"]


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    from helpers.scored_runs import write_run

    run = write_run(tmp_path_factory.mktemp("view-small") / "r")
    return RunStore.open([str(run), str(run)])


def test_hostile_paths_and_parameters_are_404_or_400_pages_never_500(small_store):
    """Every route, every slot of it, given values a hand-edited or hostile URL holds (and more drawn below): a
    page, a not-found page or a bad-request page; a 500 would mean the server failed on a request's input."""
    from starlette.testclient import TestClient

    client = TestClient(make_app(small_store), base_url="http://127.0.0.1:8765", raise_server_exceptions=False)
    for route in ROUTES:
        for value in ODD:
            response = client.get(route.format(x=value))
            assert response.status_code in (200, 400, 404), (route, value, response.status_code, response.text[:300])
    assert client.get("/run/%C2%B2/rollouts").status_code == 404
    assert client.get("/run/0/rollouts?page=%C2%B2").status_code == 400


@pytest.mark.slow
def test_any_text_in_any_slot_is_never_a_server_error(small_store):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from starlette.testclient import TestClient
    from urllib.parse import quote

    client = TestClient(make_app(small_store), base_url="http://localhost:8765", raise_server_exceptions=False)

    @settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(route=st.sampled_from(ROUTES), value=st.text(max_size=40) | st.binary(max_size=20).map(
        lambda b: "".join(f"%{x:02X}" for x in b)))
    def check(route, value):
        text = value if value.startswith("%") else quote(value, safe="")
        assert client.get(route.format(x=text)).status_code in (200, 400, 404)

    check()


@pytest.mark.parametrize("host, served", [
    ("127.0.0.1:8765", True), ("localhost:8765", True), ("[::1]:8765", True), ("LOCALHOST", True),
    ("evil.example", False), ("evil.example:8765", False), ("127.0.0.1.evil.example", False), ("", False),
    ("localhost.", False), ("127.0.0.2", False), ("0.0.0.0:8765", False), ("[::1", False)])
def test_only_requests_naming_the_address_served_are_answered(small_store, host, served):
    from starlette.testclient import TestClient

    client = TestClient(make_app(small_store), raise_server_exceptions=False)
    response = client.get("/", headers={"host": host})
    assert (response.status_code == 200) is served, (host, response.status_code)
    if not served:
        assert response.status_code == 400 and "arithmetic" not in response.text  # nothing of the data


def test_the_names_served_follow_the_address_listened_on():
    from hubgym.viewer.hosts import LOOPBACK, served_names

    assert served_names("127.0.0.1") == LOOPBACK == served_names("localhost")
    assert served_names("10.1.2.3") == LOOPBACK | {"10.1.2.3"}
    assert served_names("127.0.0.1", ["Tunnel.Example:443"]) == LOOPBACK | {"tunnel.example"}
    every = served_names("0.0.0.0")
    import socket

    assert LOOPBACK < every and socket.gethostname().lower() in every


def test_token_ids_past_the_tokenizer_are_refused_where_the_store_reads_them(small_store, tmp_path):
    from hubgym.errors import ShardError
    from hubgym.viewer.trajectory import TokenDecoder

    run = small_store.runs[0].shards[0].location.rsplit("/shards/", 1)[0]
    with pytest.raises(ShardError, match=r"column 'prompt_ids', row 0 .* breaks rule token-ids-in-vocabulary"):
        RunStore.open([run], vocab_size=3)  # the stored prompt ids are 1, 2, 3
    assert RunStore.open([run], vocab_size=6).vocab_size == 6

    class Letters:  # a tokenizer of 5 ids
        def __len__(self):
            return 5

        def decode(self, ids):
            return "abcde"[ids[0]]

    decode = TokenDecoder(Letters())
    assert [decode(i) for i in (0, 4, 5, -1, 2**31 - 1)] == ["a", "e", "[5]", "[-1]", "[2147483647]"]
