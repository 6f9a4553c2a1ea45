"""An httpx transport over aiohttp: the HTTP client of the asyncio agents' chains (agents/agent_loops.py).

  http = httpx.AsyncClient(transport=AiohttpTransport(ssl_context), trust_env=False, timeout=None)
  client = openai.AsyncOpenAI(base_url=..., api_key=..., http_client=http)   # the agent's client, as before

Why: in the asyncio loop thread httpx's own transport (httpcore) reaches sockets through anyio, and its
HTTP/1.1 is h11 in pure Python; aiohttp speaks HTTP on asyncio's own streams with its C parser. The
agent still gets an `openai.AsyncOpenAI` over an `httpx.AsyncClient` (the SDK needs httpx), only the
bytes go through aiohttp. Measured on bench_endpoint's 64-chain rollout (2-core CPU): with the garbage
collector off, httpx 1.11x / aiohttp 1.03x the same agent in trio (load ~1), 1.02x / 0.93x (load ~3);
experiments/bench/bench_endpoint.py (GC on, 21 reps): 1.20x / 0.99x (agents/agent_loops.py).

One session per transport (a chain's client): at most `max_connections` connections, kept alive; no
proxies from the environment, no timeout (httpx's timeouts are not applied here: the chain's clients
have none), no decompression by aiohttp (httpx decodes as it would). aiohttp's errors become httpx's
(`ConnectError` for a failed connection, `ReadError` for the rest), so the SDK reports them as it does
httpx's (`APIConnectionError`).
"""

from __future__ import annotations

import aiohttp
import httpx

_SKIPPED = ("host", "content-length", "transfer-encoding")  # aiohttp writes its own


class AiohttpTransport(httpx.AsyncBaseTransport):
  """`httpx.AsyncBaseTransport` sending each request with one `aiohttp.ClientSession` (made on first use,
  in the running loop); non-streaming: the reply's body is read whole."""

  def __init__(self, ssl_context=None, max_connections: int = 4):
    self.ssl_context, self.max_connections = ssl_context, max_connections
    self.session: aiohttp.ClientSession | None = None

  async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
    if self.session is None:
      self.session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=self.max_connections, ssl=self.ssl_context or True),
        timeout=aiohttp.ClientTimeout(total=None),
        auto_decompress=False,
        trust_env=False,
      )
    body = await request.aread()
    headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in _SKIPPED]
    try:
      async with self.session.request(
        request.method, str(request.url), headers=headers, data=body or None, allow_redirects=False
      ) as reply:
        content = await reply.read()
        return httpx.Response(
          reply.status,
          headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in reply.raw_headers],
          content=content,
          request=request,
        )
    except aiohttp.ClientConnectorError as e:
      raise httpx.ConnectError(str(e), request=request) from e
    except aiohttp.ClientError as e:
      raise httpx.ReadError(f"{type(e).__name__}: {e}", request=request) from e

  async def aclose(self) -> None:
    if self.session is not None:
      await self.session.close()
      self.session = None
