"""`openenv`: an OpenEnv environment server (the `openenv-core` package), reached at a URL or
started per pool, as an env type.

Each instance holds one OpenEnv session: a WebSocket to the server's `/ws` (each connection gets an
environment of its own there). `reset(row)` sends OpenEnv's reset (the row's "seed" and
"episode_id", and its "reset" object's fields) and returns the observation as text; a step sends
one action: a dict, or a JSON object string, is the action's fields; any other text fills the
action's one text field (`action_field`, else the action schema's only required field). The
step's observation is text (the observation field named `observation_field` when it is set,
else the observation object as JSON); reward and done are OpenEnv's. `{"query": "state"}`
returns OpenEnv's state as JSON. The env reward `return` sums the episode's rewards.

A row's "openenv_url" (or "openenv_app") names its server instead of the options (the session
moves there at reset; the trainer-side task, agentfly_jax/tasks/openenv.py, fills it).

Options (`--env-opt openenv.NAME=VALUE`): url (an OpenEnv server, http://host:port) or app
(`module:attr`, an OpenEnv FastAPI app, e.g. made with `openenv.core.env_server.create_app`: the
pool's first instance starts it under uvicorn on a free loopback port, shared by the pool, ended
with the env server); action_field, observation_field, timeout_s (default 30). A URL that does
not answer (or an app that does not start) fails the instance's start with an error naming it;
an action the server refuses is an observation naming what was wrong.
"""

from __future__ import annotations

import atexit
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

from envservers.env import BlockingEnv, EnvCrashed, StepOutcome, env_reward
from envservers.registry import register_env

_started: dict[str, tuple[subprocess.Popen, str]] = {}  # app spec -> (uvicorn process, its URL)
_start_lock = threading.Lock()


def _get_json(url: str, timeout_s: float) -> Any:
  with urllib.request.urlopen(url, timeout=timeout_s) as reply:  # noqa: S310 (an operator's URL)
    return json.loads(reply.read())


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _stop_started() -> None:
  for process, _ in _started.values():
    process.terminate()
  for process, _ in _started.values():
    try:
      process.wait(timeout=5)
    except subprocess.TimeoutExpired:
      process.kill()


atexit.register(_stop_started)


def start_app(app: str, timeout_s: float) -> str:
  """The URL of the uvicorn server running `app` (started on first use, shared after)."""
  with _start_lock:
    if app in _started and _started[app][0].poll() is None:
      return _started[app][1]
    port = _free_port()
    process = subprocess.Popen(
      [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
      stdin=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      if process.poll() is not None:
        detail = process.stderr.read().decode("utf-8", "replace")[-1500:]
        raise EnvCrashed(f"openenv option 'app' {app!r}: the OpenEnv server did not start: {detail}")
      try:
        _get_json(url + "/health", 2.0)
        _started[app] = (process, url)
        return url
      except (OSError, ValueError):
        time.sleep(0.1)
    process.kill()
    raise EnvCrashed(f"openenv option 'app' {app!r}: the OpenEnv server did not answer within {timeout_s:g} s")


def _check_target(url: Any, app: Any, kind: str) -> None:
  name = "'openenv_url'" if kind == "row field" else "'url'"
  if url and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
    raise ValueError(f"openenv {kind} {name} must be an http(s) URL, got {url!r}")
  name = "'openenv_app'" if kind == "row field" else "'app'"
  if app and (not isinstance(app, str) or ":" not in app):
    raise ValueError(f"openenv {kind} {name} must be 'module:attr', got {app!r}")


def _capacity_hint(data: dict) -> str:
  """What to change when an OpenEnv error says the server is full (its code CAPACITY_REACHED, or
  the message; the server sends it on connect, so it arrives either as the reply to the first
  call or just before the connection closes), else ""."""
  said = f"{data.get('code', '')} {data.get('message', '')}".lower()
  if "capacity" not in said:
    return ""
  return " (lower the env server's openenv pool cap or raise the server's max_concurrent_envs)"


@register_env
class OpenEnvEnv(BlockingEnv):
  name = "openenv"

  def __init__(
    self, url: str = "", app: str = "", action_field: str = "", observation_field: str = "", timeout_s: float = 30.0
  ):
    if url and app:
      raise ValueError("openenv takes at most one of the options 'url' (an OpenEnv server) and 'app' (module:attr)")
    _check_target(url, app, "option")
    if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
      raise ValueError(f"openenv option 'timeout_s' must be a positive number, got {timeout_s!r}")
    self.url, self.app = url.rstrip("/") if url else "", app
    self.action_option, self.action_field, self.observation_field = action_field, action_field, observation_field
    self.timeout_s = float(timeout_s)
    self.ws, self.base = None, ""
    self.total, self.steps, self.done = 0.0, 0, True

  def start_blocking(self) -> None:
    if self.url or self.app:  # else each row names its server (reset)
      self._open(self.url or start_app(self.app, self.timeout_s))

  def _open(self, base: str) -> None:
    """Opens a session with the OpenEnv server at `base` (closing one open elsewhere)."""
    from websockets.sync.client import connect

    if self.ws is not None and base == self.base:
      return
    self.close_blocking()
    try:
      schema = _get_json(base + "/schema", self.timeout_s)
    except (OSError, ValueError) as e:
      raise EnvCrashed(f"openenv url {base!r}: no OpenEnv server answers there ({e})") from None
    self.action_field = self.action_option
    if not self.action_field:
      action = schema.get("action", {})
      required = [f for f in action.get("required", []) if f != "metadata"]
      self.action_field = required[0] if len(required) == 1 else ""
    ws_url = "ws" + base[len("http") :] + "/ws"
    try:
      self.ws = connect(ws_url, open_timeout=self.timeout_s, max_size=16 << 20)
    except (OSError, Exception) as e:  # noqa: BLE001 -- websockets' handshake errors have no common base
      raise EnvCrashed(f"openenv: could not open a session at {ws_url!r}: {e}") from None
    self.base = base

  def _call(self, message: dict) -> dict:
    if self.ws is None:
      raise EnvCrashed("openenv: the session is not open")
    try:
      self.ws.send(json.dumps(message))
      reply = json.loads(self.ws.recv(timeout=self.timeout_s))
    except TimeoutError:
      raise EnvCrashed(f"openenv: no reply to {message['type']!r} within {self.timeout_s:g} s") from None
    except Exception as e:  # noqa: BLE001 -- a closed or broken connection
      why = self._parting_error()
      raise EnvCrashed(f"openenv: the session broke during {message['type']!r}: {why or e}") from None
    if reply.get("type") == "error":
      data = reply.get("data", {})
      errors = "; ".join(
        f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}" for e in data.get("errors", []) if isinstance(e, dict)
      )
      raise ValueError(
        f"the OpenEnv server refused {message['type']!r}: {data.get('message', reply)}"
        + (f" ({errors})" if errors else "")
        + _capacity_hint(data)
      )
    return reply.get("data", {})

  def _parting_error(self) -> str:
    """The error the server sent before it closed the session (e.g. its max_concurrent_envs
    reached: OpenEnv sends that on connect, then closes), else ""."""
    try:
      reply = json.loads(self.ws.recv(timeout=0.5))
    except Exception:  # noqa: BLE001 -- nothing was left to read
      return ""
    data = reply.get("data", {}) if isinstance(reply, dict) and reply.get("type") == "error" else {}
    if not data:
      return ""
    code = f" ({data['code']})" if data.get("code") else ""
    return f"the OpenEnv server said{code}: {data.get('message', reply)}" + _capacity_hint(data)

  def _text(self, data: dict) -> str:
    observation = data.get("observation", {})
    if self.observation_field:
      value = observation.get(self.observation_field, "")
      return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(observation)

  def reset_blocking(self, row: dict | None) -> str:
    row = row or {}
    extra = row.get("reset", {})
    if not isinstance(extra, dict):
      raise ValueError(f"field 'reset' must be an object of reset arguments, got {extra!r}")
    url, app = row.get("openenv_url") or "", row.get("openenv_app") or ""
    if url or app:
      if url and app:
        raise ValueError("a row names at most one of 'openenv_url' and 'openenv_app'")
      _check_target(url, app, "row field")
      self._open(url.rstrip("/") if url else start_app(app, self.timeout_s))
    elif self.ws is None:
      raise ValueError(
        "openenv: no OpenEnv server: set the row's 'openenv_url' (or 'openenv_app'), or the env option url"
      )
    data = {k: row[k] for k in ("seed", "episode_id") if row.get(k) is not None}
    reply = self._call({"type": "reset", "data": {**data, **extra}})
    self.total, self.steps, self.done = 0.0, 0, bool(reply.get("done"))
    return self._text(reply)

  def _action(self, action: Any) -> dict:
    if isinstance(action, dict):
      return action
    if isinstance(action, str) and action.strip().startswith("{"):
      try:
        value = json.loads(action)
      except ValueError:
        value = None
      if isinstance(value, dict):
        return value
    if not self.action_field:
      raise ValueError("the action must be a JSON object of the action's fields (this OpenEnv action has several)")
    return {self.action_field: action}

  def step_blocking(self, action: Any) -> StepOutcome:
    if isinstance(action, dict) and action.get("query") == "state":
      return StepOutcome(json.dumps(self._call({"type": "state"})))
    if self.done:
      return StepOutcome("Error: the episode is over (or was never reset).", done=True, info={"error": "EpisodeOver"})
    try:
      reply = self._call({"type": "step", "data": self._action(action)})
    except ValueError as e:
      return StepOutcome(f"Error: {e}", info={"error": "BadAction"})
    reward = reply.get("reward")
    self.steps += 1
    self.total += float(reward or 0.0)
    self.done = bool(reply.get("done"))
    return StepOutcome(self._text(reply), None if reward is None else float(reward), self.done)

  @env_reward("return")
  def episode_return(self) -> dict:
    """The episode's summed reward, with its steps."""
    return {"reward": self.total, "steps": float(self.steps)}

  def close_blocking(self) -> None:
    ws, self.ws, self.base = self.ws, None, ""
    if ws is not None:
      try:  # OpenEnv's close, then its end of the handshake
        ws.send(json.dumps({"type": "close"}))
        ws.recv(timeout=2)
      except Exception:  # noqa: BLE001, S110 -- closing anyway
        pass
      ws.close()
