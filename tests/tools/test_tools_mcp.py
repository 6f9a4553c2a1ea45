"""MCP servers' tools as Tools: an MCP server written here with the SDK (MCPServer, mcp 2.x) over
stdio and streamable HTTP; its schemas, results and errors; a hung server times out; killing the
server mid-rollout gives error observations and the rollout finishes; config.task.mcp_servers."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import trio

from agent_testlib import agent_tokenizer, hermes_call, tokenizer_dir
from agentfly_jax.agents import ToolCallAgent, rollout
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.tools.limits import tool_metrics
from agentfly_jax.tools.mcp import tools_from_mcp

SERVER = textwrap.dedent('''
    import logging, os, sys, time
    from mcp.server.mcpserver import MCPServer

    logging.disable(logging.CRITICAL)  # quiet: its tracebacks would fill the test's stderr

    server = MCPServer("codes")
    CALLS = os.environ.get("MCP_TEST_CALLS")

    @server.tool()
    def fetch_code(key: str, times: int = 1) -> str:
      """Returns the code of a key."""
      if CALLS:
        with open(CALLS, "a") as f:
          f.write(key + "\\n")
      time.sleep(0.05)
      return f"code of {key}: " + "x" * times

    @server.tool()
    def broken(reason: str) -> str:
      """Always fails."""
      raise ValueError(reason)

    @server.tool()
    def hang() -> str:
      """Never answers in time."""
      time.sleep(60)
      return "late"

    if __name__ == "__main__":
      with open(sys.argv[1], "w") as f:
        f.write(str(os.getpid()))
      if len(sys.argv) > 2:
        server.run(transport="streamable-http", port=int(sys.argv[2]))
      else:
        server.run()
''')


@pytest.fixture
def server_file(tmp_path):
  path = tmp_path / "codes_server.py"
  path.write_text(SERVER)
  return path


def _env(tmp_path):
  return {**os.environ, "MCP_TEST_CALLS": str(tmp_path / "calls.log"), "PYTHONUNBUFFERED": "1"}


@pytest.mark.slow  # ~10 s: a server start and a 3 s hung call
def test_stdio_server_tools_schemas_results_errors_and_a_hung_call(server_file, tmp_path):
  tools = tools_from_mcp(
    command=[sys.executable, str(server_file), str(tmp_path / "pid")], env=_env(tmp_path), call_timeout_s=3.0
  )
  fetch, broken, hang = tools
  try:
    assert [t.name for t in tools] == ["fetch_code", "broken", "hang"]
    params = fetch.schema["function"]["parameters"]
    assert params["required"] == ["key"] and params["properties"]["times"]["type"] == "integer"
    assert fetch.schema["function"]["description"] == "Returns the code of a key."
    assert fetch(key="fox", times=2) == "code of fox: xx"
    assert broken(reason="no luck").startswith("Error: tool 'broken' raised McpToolError")
    assert "is missing required argument(s) ['key']" in fetch(times=1)
    assert "'times' must be of JSON type integer" in fetch(key="a", times="2")
    t0 = time.monotonic()
    assert "did not answer within 3.0 s" in hang()
    assert time.monotonic() - t0 < 8
    assert fetch(key="owl") == "code of owl: x"  # the connection survives a timed-out call
  finally:
    fetch.mcp_connection.close()
  assert "unavailable" in fetch(key="fox")


def _kill_when(path_calls, path_pid, at_least):
  async def killer():
    while True:
      if os.path.exists(path_calls) and len(open(path_calls).read().split()) >= at_least:
        os.kill(int(open(path_pid).read()), signal.SIGKILL)
        return
      await trio.sleep(0.02)

  return killer


def test_killing_the_server_mid_rollout_gives_error_observations_and_the_rollout_finishes(server_file, tmp_path):
  calls_log, pid_file = tmp_path / "calls.log", tmp_path / "pid"
  tools = tools_from_mcp(
    command=[sys.executable, str(server_file), str(pid_file)], env=_env(tmp_path), call_timeout_s=5.0, max_concurrency=4
  )
  tok = agent_tokenizer()

  def script(prompt_ids):
    text = tok.decode(prompt_ids)
    if text.count("<tool_response>") >= 3:
      return tok.encode("done<|im_end|>")
    return tok.encode(hermes_call("fetch_code", {"key": "fox"}) + "<|im_end|>")

  agent = ToolCallAgent(tokenizer_dir(), tools=tools)
  results = {}

  async def main():
    async with trio.open_nursery() as nursery:
      nursery.start_soon(_kill_when(calls_log, pid_file, 8))

      async def run():
        results["trajs"] = await rollout(
          agent, [{"question": f"q {i}"} for i in range(8)], sampler=ScriptedSampler(script, delay_s=0.02), max_turns=5
        )

      nursery.start_soon(run)

  t0 = time.monotonic()
  trio.run(main)
  assert time.monotonic() - t0 < 30
  trajs = results["trajs"]
  observations = [c for t in trajs for c in t.tool_calls]
  assert len(trajs) == 8 and all(t.error is None and t.finish_reason == "no_tool_call" for t in trajs)
  assert len(observations) == 24
  ok = [c for c in observations if c["ok"]]
  failed = [c for c in observations if not c["ok"]]
  # killed once 8 calls had started, 4 at a time: at least the first 4 had answered
  assert len(ok) >= 4 and all(c["observation"] == "code of fox: x" for c in ok)
  assert failed and all(c["observation"].startswith("Error: tool 'fetch_code'") for c in failed)
  assert any("MCP server" in c["observation"] for c in failed)
  metrics = tool_metrics(tools)
  assert metrics["tools/fetch_code/calls"] == 24 and metrics["tools/fetch_code/errors"] == len(failed)
  tools[0].mcp_connection.close()


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow  # ~5-10 s: two server starts
def test_streamable_http_server_and_config_task_mcp_servers(server_file, tmp_path):
  from agentfly_jax.rl.config import default_config
  from agentfly_jax.tasks.from_config import build_task, set_custom_task

  port = _free_port()
  proc = subprocess.Popen(
    [sys.executable, str(server_file), str(tmp_path / "pid"), str(port)],
    env=_env(tmp_path),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  try:
    deadline = time.monotonic() + 60
    while True:  # until the server listens
      try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        break
      except OSError:
        assert time.monotonic() < deadline and proc.poll() is None, "the MCP server did not start"
        time.sleep(0.1)
    url = f"http://127.0.0.1:{port}/mcp"
    config = set_custom_task(
      default_config(),
      module="agentfly_jax.tasks.lookup",
      mcp_servers=f"{url}; {sys.executable} {server_file} {tmp_path / 'pid2'}",
    )
    with pytest.raises(ValueError, match="config.task.mcp_servers=.*tool names clash"):
      build_task(config)
    config.task.mcp_servers = url
    task = build_task(config)
    names = [t.name for t in task.tools]
    assert names == ["lookup", "fetch_code", "broken", "hang"]
    fetch = task.tools[1]
    assert fetch(key="elk") == "code of elk: x"
    proc.kill()
    proc.wait()
    assert fetch(key="elk").startswith("Error: tool 'fetch_code' raised")
    fetch.mcp_connection.close()
  finally:
    proc.kill()
