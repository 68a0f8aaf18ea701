"""POST JSON to an OpenAI-compatible server: one aiohttp session, msgspec JSON, retries with backoff.

Why not the `openai` SDK: at 64-256 requests in flight its request building and response models, and
its httpx pool's scan of every connection per request, were most of a rollout client's CPU against a
server that answers at once (bench/bench_verifiers.py --server instant). The rollout engine needs one
call, POST a JSON body and read a JSON object back, so it makes that call directly.

    client = JSONClient("http://127.0.0.1:8000/v1", api_key="EMPTY", max_retries=4, timeout_s=120, connections=256)
    reply = await client.post("/completions", {"model": "m", "prompt": [1, 2, 3], "max_tokens": 8})
    await client.close()

Retried, as the SDK retries them: connection failures, timeouts, 408, 409, 429 and 5xx, with exponential
backoff (0.5 s doubling, at most 8 s, with jitter; a `Retry-After` of up to 60 s is honoured). What
still fails raises `ServerUnavailable`; any other status raises `ServerRefused` with the server's text.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

log = logging.getLogger(__name__)

RETRIED_STATUS = frozenset({408, 409, 429})  # and every 5xx


class ServerUnavailable(Exception):
    """The server could not be reached, or kept failing, after the retries."""


class ServerRefused(Exception):
    """The server answered with a status that retrying does not change (4xx other than the retried ones)."""

    def __init__(self, status: int, text: str):
        super().__init__(f"Error code: {status} - {text}")
        self.status = status


class JSONClient:
    """One aiohttp session (made on first use, in the running event loop) for `connections` requests in flight."""

    def __init__(self, base_url: str, *, api_key: str, max_retries: int, timeout_s: float, connections: int):
        import msgspec

        self.base_url, self.max_retries, self.timeout_s = base_url.rstrip("/"), max_retries, timeout_s
        self.connections = connections
        self.headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
        self._encode, self._decode = msgspec.json.encode, msgspec.json.decode
        self._session: Any = None

    def _open(self) -> Any:
        import aiohttp

        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.connections, limit_per_host=self.connections,
                                             keepalive_timeout=60)
            self._session = aiohttp.ClientSession(connector=connector, headers=self.headers,
                                                  timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._session

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        """The decoded JSON answer to POST `body` at base_url + path."""
        import aiohttp

        session, data, url = self._open(), self._encode(body), self.base_url + path
        for attempt in range(self.max_retries + 1):
            retry_after: float | None = None
            try:
                async with session.post(url, data=data) as response:
                    raw = await response.read()
                    if response.status < 300:
                        return self._decode(raw)
                    text = raw.decode(errors="replace")
                    if response.status not in RETRIED_STATUS and response.status < 500:
                        raise ServerRefused(response.status, text)
                    failure = f"HTTP {response.status}: {text[:300]}"
                    retry_after = _seconds(response.headers.get("Retry-After"))
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                failure = f"{type(exc).__name__}: {exc}"
            if attempt == self.max_retries:
                raise ServerUnavailable(failure)
            backoff = min(0.5 * 2 ** attempt, 8.0) * (0.75 + random.random() / 4)
            wait = retry_after if retry_after is not None else backoff
            log.info("Retrying request to %s in %.2f seconds (%s)", path, wait, failure)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _seconds(value: str | None) -> float | None:
    """A Retry-After header in seconds (0-60); None when absent, a date, or out of range."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds <= 60 else None
