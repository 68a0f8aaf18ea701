"""The openai engine's HTTP client retries what the openai SDK retries, and nothing else."""

import asyncio

import pytest
from aiohttp import web

from hubgym.engines.http_json import JSONClient, ServerRefused, ServerUnavailable


def serve(answers: list[tuple[int, dict, str]], coro_factory):
    """Run `coro_factory(url)` against a server answering each POST with the next (status, headers, body)."""
    seen: list[dict] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append({"body": await request.json(), "auth": request.headers.get("Authorization")})
        status, headers, body = answers[min(len(seen), len(answers)) - 1]
        return web.Response(status=status, headers=headers, text=body, content_type="application/json")

    async def main():
        app = web.Application()
        app.router.add_post("/v1/completions", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            return await coro_factory(f"http://127.0.0.1:{port}/v1")
        finally:
            await runner.cleanup()

    return asyncio.run(main()), seen


async def post_once(url: str, retries: int = 3):
    client = JSONClient(url, api_key="sk-secret", max_retries=retries, timeout_s=10, connections=4)
    try:
        return await client.post("/completions", {"prompt": [1, 2]})
    finally:
        await client.close()


def test_429_and_5xx_are_retried_until_an_answer():
    answers = [(429, {"Retry-After": "0"}, '{"error": "slow down"}'), (503, {}, "busy"), (200, {}, '{"ok": 1}')]
    reply, seen = serve(answers, post_once)
    assert reply == {"ok": 1}
    assert len(seen) == 3 and all(s["body"] == {"prompt": [1, 2]} for s in seen)
    assert seen[0]["auth"] == "Bearer sk-secret"


def test_a_client_error_is_not_retried_and_says_what_the_server_said():
    with pytest.raises(ServerRefused, match="400.*bad prompt") as info:
        serve([(400, {}, '{"error": "bad prompt"}')], post_once)
    assert info.value.status == 400 and "sk-secret" not in str(info.value)


def test_a_server_that_keeps_failing_gives_up_after_the_retries_without_the_key():
    async def two_retries(url):
        return await post_once(url, retries=2)

    with pytest.raises(ServerUnavailable, match="HTTP 500") as info:
        serve([(500, {"Retry-After": "0"}, "boom")], two_retries)
    assert "sk-secret" not in str(info.value)


def test_an_unreachable_server_is_unavailable():
    from hubgym.engines.server import free_port

    with pytest.raises(ServerUnavailable, match="Connect"):
        asyncio.run(post_once(f"http://127.0.0.1:{free_port()}/v1", retries=0))
