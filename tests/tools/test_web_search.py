"""`web_search` against a real HTTP JSON backend on loopback (requests counted on the server) and a
real redis-server: the second identical query never reaches the backend; redis killed mid-run
gives one warning and the LRU takes over."""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import subprocess
import threading
import time
import warnings

import pytest
import trio

from agentfly_jax.tools import get_tool, web_search
from agentfly_jax.tools import web

pytestmark = pytest.mark.timeout(120)


class _Backend(http.server.ThreadingHTTPServer):
  def __init__(self):
    super().__init__(("127.0.0.1", 0), _Handler)
    self.requests: list[dict] = []
    self.fail_with: int | None = None


class _Handler(http.server.BaseHTTPRequestHandler):
  def do_POST(self):  # noqa: N802
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    self.server.requests.append({**body, "auth": self.headers.get("Authorization")})
    if self.server.fail_with:
      self.send_error(self.server.fail_with)
      return
    n = body["num_results"]
    results = [
      {
        "title": f"{body['query']} #{i}",
        "url": f"http://example.test/{i}",
        "snippet": f"about {body['query']}",
        "rank": i,
      }
      for i in range(n)
    ]
    data = json.dumps({"results": results}).encode()
    self.send_response(200)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def log_message(self, *args):
    pass


@pytest.fixture
def backend(monkeypatch):
  server = _Backend()
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  monkeypatch.setenv("AGENTFLY_SEARCH_URL", f"http://127.0.0.1:{server.server_address[1]}/search")
  monkeypatch.setenv("AGENTFLY_SEARCH_API_KEY", "k-123")
  monkeypatch.delenv("AGENTFLY_REDIS_URL", raising=False)
  web.reset_default_cache()
  yield server
  web.reset_default_cache()
  server.shutdown()
  server.server_close()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture
def redis_server():
  binary = shutil.which("redis-server")
  if binary is None:
    pytest.skip("redis-server is not installed (.ci/setup installs it)")
  port = _free_port()
  process = subprocess.Popen(
    [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL
  )
  import redis

  client = redis.Redis(port=port)
  deadline = time.monotonic() + 20
  while True:
    try:
      client.ping()
      break
    except redis.exceptions.ConnectionError:
      if time.monotonic() > deadline or process.poll() is not None:
        process.kill()
        raise RuntimeError("redis-server did not start")
      time.sleep(0.05)
  yield process, f"redis://127.0.0.1:{port}/0", client
  process.kill()
  process.wait()


def test_lru_cache_keeps_repeats_off_the_backend(backend):
  first = web_search("blue whales", num_results=3)
  assert first.startswith("[1] blue whales #0 (http://example.test/0)") and "[3]" in first
  assert web_search("blue whales", num_results=3) == first
  assert len(backend.requests) == 1
  assert backend.requests[0] == {"query": "blue whales", "num_results": 3, "auth": "Bearer k-123"}
  web_search("blue whales", num_results=2)  # another request: reaches the backend
  assert len(backend.requests) == 2
  cache = web.default_cache()
  cache.maxsize = 2
  web_search("a")
  web_search("b")
  web_search("blue whales", num_results=3)  # evicted by a and b: asked again
  assert len(backend.requests) == 5


def test_redis_cache_is_shared_and_redis_death_falls_back_to_lru(backend, redis_server, monkeypatch):
  process, url, client = redis_server
  monkeypatch.setenv("AGENTFLY_REDIS_URL", url)
  web.reset_default_cache()
  answer = web_search("red pandas")
  assert web_search("red pandas") == answer and len(backend.requests) == 1
  assert any(k.startswith(b"agentfly:web_search:") for k in client.keys())
  web.reset_default_cache()  # a fresh process-wide cache (empty LRU): redis answers
  assert web_search("red pandas") == answer and len(backend.requests) == 1
  assert web.default_cache().hits["redis"] == 1

  process.kill()
  process.wait()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    other = web_search("snow leopards")  # redis gone: backend answers, one warning
    again = web_search("snow leopards")  # the LRU answers
    web_search("red pandas")  # still in the LRU
  assert other == again and "snow leopards #0" in other
  assert len(backend.requests) == 2
  redis_warnings = [w for w in caught if "redis" in str(w.message)]
  assert len(redis_warnings) == 1 and "LRU" in str(redis_warnings[0].message)


def test_backend_errors_become_error_observations(backend, monkeypatch):
  backend.fail_with = 503
  output = trio.run(web_search.run, {"query": "x"})
  assert not output.ok and "HTTP 503" in output.observation
  backend.fail_with = None
  assert not trio.run(web_search.run, {"query": "  "}).ok
  assert "num_results" in trio.run(web_search.run, {"query": "x", "num_results": 99}).observation
  monkeypatch.setenv("AGENTFLY_SEARCH_URL", f"http://127.0.0.1:{_free_port()}/nothing")
  output = trio.run(web_search.run, {"query": "y"})
  assert not output.ok and "unreachable" in output.observation
  monkeypatch.delenv("AGENTFLY_SEARCH_URL")
  assert "AGENTFLY_SEARCH_URL" in trio.run(web_search.run, {"query": "z"}).observation


def test_python_backend_and_by_name(backend):
  calls = []
  web.set_search_backend(lambda q, n: calls.append(q) or [{"title": q, "url": "u", "snippet": "s"}])
  try:
    assert web_search("local") == "[1] local (u)\ns" == web_search("local")
    assert calls == ["local"] and not backend.requests
  finally:
    web.set_search_backend(None)
  assert get_tool("web_search") is web_search
