"""MCP servers' tools as `Tool`s: `tools_from_mcp(command=[...])` (stdio) or `tools_from_mcp(url=...)`
(streamable HTTP).

  tools = tools_from_mcp(command=["python", "my_server.py"], call_timeout_s=30, max_concurrency=4)
  agent = ToolCallAgent(tokenizer, tools=[*tools, answer])

Every tool the server lists becomes a `Tool` with the server's input schema (arguments are
checked against it: required ones present, JSON types of the top-level ones). The connection
(the `mcp` SDK's `Client`) lives in a background thread with its own trio loop (an anyio
blocking portal), so it outlives the trainer's per-step rollout runs; a call runs in a worker
thread of the rollout and waits on that loop. The error-as-observation contract holds: a tool
error (`is_error`), a hung server (`call_timeout_s`), a crashed or killed server (the connection
is then marked dead: later calls fail at once) all come back as error observations, never as an
exception out of the rollout. Per-tool limits (`max_concurrency`, `rate`) apply to every tool of
the server. The servers are closed at process exit (or `McpConnection.close()`).
"""

from __future__ import annotations

import atexit
import json
import logging
import shlex
import threading
from typing import Any, Sequence

from agentfly_jax.tools.tool import DEFAULT_MAX_LENGTH, Tool

log = logging.getLogger(__name__)


class McpToolError(RuntimeError):
  """The MCP server reported an error for a call (or cannot be reached)."""


def _result_text(result) -> str:
  parts = []
  for item in getattr(result, "content", None) or ():
    text = getattr(item, "text", None)
    if isinstance(text, str):
      parts.append(text)
    else:
      dump = item.model_dump(exclude_none=True) if hasattr(item, "model_dump") else str(item)
      parts.append(json.dumps(dump, ensure_ascii=False, default=str))
  if not parts and getattr(result, "structured_content", None) is not None:
    parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
  return "\n".join(parts)


class McpConnection:
  """One MCP server: its client connection in a background trio loop; `call` from any thread."""

  def __init__(
    self,
    command: Sequence[str] | str | None = None,
    url: str | None = None,
    *,
    name: str | None = None,
    env: dict | None = None,
    call_timeout_s: float = 30.0,
    connect_timeout_s: float = 60.0,
  ):
    if (command is None) == (url is None):
      raise ValueError("tools_from_mcp: give exactly one of command=[...] (stdio) or url=... (streamable HTTP)")
    if isinstance(command, str):
      command = shlex.split(command)
    if command is not None and (not command or not all(isinstance(c, str) for c in command)):
      raise ValueError(f"tools_from_mcp: command must be a non-empty list of strings, got {command!r}")
    if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
      raise ValueError(f"tools_from_mcp: url must be an http(s) URL, got {url!r}")
    self.command, self.url, self.env = list(command) if command else None, url, env
    self.name = name or (url if url else " ".join(self.command))
    self.call_timeout_s, self.connect_timeout_s = float(call_timeout_s), float(connect_timeout_s)
    self.tools: list = []  # the server's tool listing (mcp types)
    self.dead: str | None = None  # why the connection is gone, once it is
    self._client = None
    self._scope = None
    self._portal = None
    self._portal_cm = None
    self._lock = threading.Lock()

  def _server_spec(self):
    if self.url is not None:
      return self.url
    from mcp import StdioServerParameters

    return StdioServerParameters(command=self.command[0], args=self.command[1:], env=self.env)

  async def _hold(self, ready) -> None:
    """Runs in the background loop for the connection's life: connects, lists, then waits until
    `close()` cancels it or the transport fails (a crashed server)."""
    import anyio
    from mcp import Client

    try:
      with self._scope:
        async with Client(self._server_spec()) as client:
          listing = await client.list_tools()
          self.tools, self._client = list(listing.tools), client
          ready.set()
          await anyio.sleep_forever()
    except Exception as e:  # noqa: BLE001 — a crashed server ends the connection, not the run
      self.dead = f"{type(e).__name__}: {e}"
      log.warning("MCP server %s: connection ended: %s", self.name, self.dead)
    finally:
      self.dead = self.dead or "closed"
      ready.set()

  async def _wait_ready(self, ready) -> bool:
    import anyio

    with anyio.move_on_after(self.connect_timeout_s):
      await ready.wait()
    return ready.is_set()

  def start(self) -> "McpConnection":
    """Connects and lists the tools; RuntimeError naming the server if that fails."""
    import anyio
    from anyio.from_thread import start_blocking_portal

    self._portal_cm = start_blocking_portal(backend="trio")
    self._portal = self._portal_cm.__enter__()
    ready, self._scope = self._portal.call(lambda: (anyio.Event(), anyio.CancelScope()))
    self._portal.start_task_soon(self._hold, ready)
    in_time = self._portal.call(self._wait_ready, ready)
    if self._client is None:
      error = self.dead if in_time else f"no answer within connect_timeout_s={self.connect_timeout_s}"
      self.close()
      raise RuntimeError(f"MCP server {self.name!r}: could not connect and list its tools: {error}")
    return self

  async def _call(self, name: str, arguments: dict) -> str:
    import anyio

    try:
      with anyio.fail_after(self.call_timeout_s):
        result = await self._client.call_tool(name, arguments)
    except TimeoutError:
      raise TimeoutError(f"MCP server {self.name!r} did not answer within {self.call_timeout_s} s") from None
    text = _result_text(result)
    if getattr(result, "is_error", False):
      raise McpToolError(text or "the server reported an error")
    return text

  def call(self, name: str, arguments: dict) -> str:
    """Calls a tool (blocking; from any thread but the portal's); raises on any failure."""
    if self.dead is not None or self._portal is None:
      raise McpToolError(f"MCP server {self.name!r} is unavailable ({self.dead or 'closed'})")
    try:
      return self._portal.call(self._call, name, arguments)
    except (McpToolError, TimeoutError):
      raise
    except Exception as e:  # the transport broke: the server crashed or was killed
      if self.dead is None:
        self.dead = f"{type(e).__name__}: {e}"
      raise McpToolError(f"MCP server {self.name!r} failed: {type(e).__name__}: {e}") from None

  def close(self) -> None:
    """Disconnects (stops a stdio server) and ends the background loop."""
    with self._lock:
      portal_cm, self._portal_cm = self._portal_cm, None
    if portal_cm is None:
      return
    try:
      self._portal.call(self._scope.cancel)
    except Exception:  # noqa: BLE001 — the loop may already be gone
      pass
    try:
      portal_cm.__exit__(None, None, None)
    except Exception:  # noqa: BLE001
      log.debug("closing MCP server %s", self.name, exc_info=True)
    self._portal = None
    self.dead = self.dead or "closed"


_open: list[McpConnection] = []


@atexit.register
def _close_all() -> None:
  for connection in list(_open):
    connection.close()


def tools_from_mcp(
  command: Sequence[str] | str | None = None,
  url: str | None = None,
  *,
  name: str | None = None,
  prefix: str = "",
  env: dict | None = None,
  call_timeout_s: float = 30.0,
  connect_timeout_s: float = 60.0,
  max_concurrency: int | None = None,
  rate: tuple[int, float] | None = None,
  max_length: int | None = DEFAULT_MAX_LENGTH,
) -> list[Tool]:
  """Starts / connects to an MCP server and returns one `Tool` per tool it lists.

  Args:
    command: the stdio server's command line (a list, or one string split like a shell would).
    url: a streamable-HTTP server's URL (e.g. "http://127.0.0.1:8000/mcp").
    name: the server's name in error messages (default: the command or URL).
    prefix: prepended to every tool name (two servers with equal tool names).
    env: the stdio server's environment (default: the SDK's safe subset of ours).
    call_timeout_s: a call unanswered for this long gives a timeout observation.
    connect_timeout_s: connecting + listing the tools must take less.
    max_concurrency, rate: per-tool limits (`@tool`), for each of the server's tools.
    max_length: observation characters kept.
  """
  connection = McpConnection(
    command, url, name=name, env=env, call_timeout_s=call_timeout_s, connect_timeout_s=connect_timeout_s
  ).start()
  _open.append(connection)
  tools = []
  for listed in connection.tools:
    schema_in = getattr(listed, "input_schema", None) or getattr(listed, "inputSchema", None) or {}
    parameters = {
      "type": "object",
      "properties": dict(schema_in.get("properties") or {}),
      **({"required": list(schema_in["required"])} if schema_in.get("required") else {}),
    }
    if schema_in.get("additionalProperties") is False:
      parameters["additionalProperties"] = False
    tool_name = f"{prefix}{listed.name}"
    schema = {
      "type": "function",
      "function": {
        "name": tool_name,
        "description": listed.description or f"MCP tool {listed.name}",
        "parameters": parameters,
      },
    }

    t = Tool(
      _caller(connection, listed.name, tool_name, listed.description),
      name=tool_name,
      schema=schema,
      max_length=max_length,
      timeout_s=call_timeout_s + 5.0,
      max_concurrency=max_concurrency,
      rate=rate,
    )
    t.mcp_connection = connection
    tools.append(t)
  return tools


def _caller(connection: McpConnection, server_tool: str, tool_name: str, description: str | None):
  def call(**arguments):
    return connection.call(server_tool, arguments)

  call.__name__, call.__doc__ = tool_name, description
  return call


def tools_from_config(spec: str, **kwargs) -> list[Tool]:
  """The tools of the MCP servers named in `spec` (config.task.mcp_servers): entries separated by
  ';', each a URL (streamable HTTP) or a command line (stdio)."""
  tools = []
  for entry in filter(None, (e.strip() for e in (spec or "").split(";"))):
    if entry.startswith(("http://", "https://")):
      tools += tools_from_mcp(url=entry, **kwargs)
    else:
      tools += tools_from_mcp(command=shlex.split(entry), **kwargs)
  return tools
