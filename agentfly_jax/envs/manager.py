"""The trainer-side resource manager: env instances for chains, spread over env servers.

    manager = EnvManager(servers=["10.0.0.5:8765", "10.0.0.6:8765"])
    env = await manager.acquire("python_sandbox", chain_id="row3-chain1")   # an `Env`
    await env.reset(row)
    obs = (await env.step("print(1 + 1)")).observation
    await manager.release("python_sandbox", "row3-chain1")

- Spreading: a new chain goes to the server holding the fewest of this manager's chains of that
  env type (ties: round-robin); a server that does not serve the type is skipped.
- Back-off: when every server's pool is full (PoolExhausted) or unreachable, acquire retries with
  exponential back-off and jitter until `acquire_timeout_s`.
- Reconnect: a lost connection is reopened at the next call; a chain whose server went away gets
  an error observation for the call that failed, then a fresh instance (state lost, and said so).
  Calls waiting on one connect attempt that fails fail with it (a hung server costs one connect
  timeout, not one per waiting chain).
- Works from any trio run: connections belong to the run that opened them (a synchronous one-off
  tool call does its own `trio.run`), so each run gets its own connections and bindings.
- `metrics()` reports pool use (allocated envs per type, back-off, reconnects, errors).
- Security: the shared token ($AGENTFLY_ENV_TOKEN / $AGENTFLY_ENV_TOKEN_FILE, or `token=`) and
  TLS ($AGENTFLY_ENV_TLS_CA, or `ssl_context=`) are those of `envservers.client`; a refused
  token fails at once (EnvUnavailable), it is not retried.
- Containment: a reply that breaks the protocol or has the wrong shape fails only that call (an
  error observation for `step`), and the connection is dropped and reopened at the next call.
- Observations: a string, or a list of content parts (text, `image_url` data URLs: PROTOCOL.md); a list is
  normalized with its images decoded and bounded (agentfly_jax/vision), an unusable image is an error
  observation for `step` (naming the part) and EnvUnavailable for `reset`.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import random
import time
import weakref
from typing import Any, Sequence

import trio

from agentfly_jax.envs.base import StepResult
from agentfly_jax.vision.content import normalize_content
from agentfly_jax.vision.decode import ImageError
from envservers import auth
from envservers.client import AuthenticationFailed, BadReply, Connection, ConnectionLost, ServerHung
from envservers.protocol import (
  AUTH_FAILED,
  AUTH_REQUIRED,
  NOT_ACQUIRED,
  POOL_EXHAUSTED,
  UNKNOWN_ENV,
  ProtocolError,
  RemoteError,
  parse_address,
)


COUNTERS = (
  "acquires",
  "acquire_retries",
  "pool_full",
  "connects",
  "reconnects",
  "errors",
  "connection_errors",
  "auth_failures",
  "timeouts",
  "abandoned_acquires",
)


class EnvUnavailable(RuntimeError):
  """No env instance could be had (unknown type, all servers down, or pools full too long)."""


class RemoteEnv:
  """An `Env` proxy for one chain's instance on one server (see agentfly_jax.envs.base.Env)."""

  def __init__(
    self,
    manager: "EnvManager",
    state: "_RunState",
    env_name: str,
    chain_id: str,
    address: str,
    connection: Connection,
    info: dict,
  ):
    self._manager = manager
    self._state = state
    self.env_name = env_name
    self.chain_id = chain_id
    self.address = address
    self.connection = connection
    self.info = info
    self._lost_note = ""
    self._rebind = False

  def __repr__(self):
    return f"RemoteEnv({self.env_name!r}, chain={self.chain_id!r}, server={self.address})"

  async def _ensure_bound(self) -> None:
    """Re-acquires on a fresh connection if ours was lost (the old instance is gone)."""
    if not self.connection.closed and not self._rebind:
      return
    self._rebind = False
    address, connection, info = await self._manager._bind(self._state, self.env_name, self.chain_id)
    self._state.load[(self.env_name, self.address)] -= 1
    self._state.load[(self.env_name, address)] += 1
    self.address, self.connection, self.info = address, connection, info
    self._lost_note = (
      "[note: the environment server connection was lost; this is a fresh environment and earlier state is gone]\n"
    )

  async def _call(self, op: str, args: dict) -> dict:
    await self._ensure_bound()
    payload = {"env": self.env_name, "chain_id": self.chain_id, **args}
    try:
      result = await self.connection.call(op, payload, timeout_s=self._call_limit_s())
      problem = _check_result(op, result)
      if problem is not None:  # the server is broken: drop it, reconnect at the next call
        await self.connection.aclose()
        raise BadReply(f"env server {self.address}: bad {op!r} result: {problem}")
      return result
    except RemoteError as e:
      if e.error_type == NOT_ACQUIRED:  # the server lost our binding: take a fresh one next call
        self._rebind = True
      self._manager._count("errors")
      raise
    except ServerHung as e:  # another call on this connection timed out: we waited on the same
      self._manager._count("timeouts")  # hung server, so this is a timeout too
      raise trio.TooSlowError(f"the environment server stopped answering ({e})") from None
    except ConnectionLost:
      self._manager._count("connection_errors")
      raise
    except trio.TooSlowError:  # the server did not answer within the env's limit: treat it as
      self._manager._count("timeouts")  # hung (new chains go elsewhere for a while)
      self._manager._down_until[self.address] = time.monotonic() + self._manager.down_retry_s
      await self.connection.aclose(hung_after_s=self._call_limit_s())
      raise

  def _call_limit_s(self) -> float:
    """Client-side limit of one call: the env's own limit (from acquire) + the reply grace."""
    env_limit = self.info.get("call_timeout_s") if isinstance(self.info, dict) else None
    limit = (
      float(env_limit) if isinstance(env_limit, (int, float)) and env_limit > 0 else self._manager.default_call_limit_s
    ) + self._manager.reply_grace_s
    if self._manager.call_timeout_s is not None:
      limit = min(limit, self._manager.call_timeout_s)
    return limit

  async def reset(self, row: dict | None = None) -> str:
    """Starts an episode; raises EnvUnavailable if the server cannot be reached."""
    try:
      result = await self._call("reset", {"row": row})
    except (ConnectionLost, RemoteError, trio.TooSlowError) as e:
      raise EnvUnavailable(f"{self!r}: reset failed: {e}") from e
    try:
      return await self._with_note(result["observation"])
    except ImageError as e:
      raise EnvUnavailable(f"{self!r}: reset returned an unusable observation: {e}") from e

  def _take_note(self) -> str:
    note, self._lost_note = self._lost_note, ""
    return note

  async def _with_note(self, observation: str | list) -> str | list[dict]:
    """The observation after any lost-state note; a list of content parts normalized (images decoded and
    bounded by agentfly_jax/vision, in a worker thread so other chains go on; ImageError names the part)."""
    note = self._take_note()
    if isinstance(observation, str):
      return note + observation
    parts = await trio.to_thread.run_sync(normalize_content, observation, "observation")
    return ([{"type": "text", "text": note}] if note else []) + parts

  async def step(self, action: Any) -> StepResult:
    """Runs an action; every failure (server gone, env crashed, bad action) is an observation."""
    try:
      result = await self._call("step", {"action": action})
    except (TypeError, ValueError, ProtocolError) as e:  # not JSON, or over the frame limit
      return StepResult(
        observation=f"Error: the action cannot be sent to the environment: {e}", info={"error": "BadAction"}
      )
    except RemoteError as e:
      return StepResult(observation=f"Error ({e.error_type}): {e.message}", info={"error": e.error_type})
    except trio.TooSlowError as e:  # our own limit, or the connection found hung by another call on it
      why = str(e) or f"the environment server did not answer within {self._call_limit_s():g} s"
      return StepResult(
        observation=f"Error (Timeout): {why}; the environment state is lost.", info={"error": "Timeout"}
      )
    except (ConnectionLost, EnvUnavailable) as e:
      return StepResult(
        observation=f"Error: the environment server is unavailable ({e}); the environment state is lost.",
        info={"error": "ConnectionLost"},
      )
    try:
      observation = await self._with_note(result["observation"])
    except ImageError as e:
      return StepResult(
        observation=f"Error: the environment returned an unusable observation: {e}", info={"error": "BadImage"}
      )
    return StepResult(
      observation=observation,
      reward=result.get("reward"),
      done=bool(result.get("done")),
      info=result.get("info") or {},
    )

  async def compute_reward(self, name: str, **kwargs) -> dict:
    """Runs the env-bound reward `name` in this chain's instance: {'reward': float, ...}."""
    try:
      return await self._call("compute_reward", {"name": name, "kwargs": kwargs})
    except (ConnectionLost, RemoteError, trio.TooSlowError) as e:
      raise EnvUnavailable(f"{self!r}: reward {name!r} failed: {e}") from e


def _check_result(op: str, result: dict) -> str | None:
  """None if an op's result has the fields the manager reads, else what is wrong."""
  observation = result.get("observation")
  if op in ("reset", "step") and not isinstance(observation, (str, list)):
    return f"'observation' must be a string or a list of content parts, got {type(observation).__name__}"
  if op == "step":
    reward, info = result.get("reward"), result.get("info", {})
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
      return f"'reward' must be a number or null, got {type(reward).__name__}"
    if not isinstance(result.get("done", False), bool) or not isinstance(info, (dict, type(None))):
      return "'done' must be a bool and 'info' an object"
  if op == "compute_reward" and (
    isinstance(result.get("reward"), bool) or not isinstance(result.get("reward"), (int, float))
  ):
    return f"'reward' must be a number, got {type(result.get('reward')).__name__}"
  return None


class _RunState:
  """Connections and bindings of one trio run."""

  def __init__(self, token):
    self.token = token
    self.connections: dict[str, Connection] = {}
    self.connect_locks: dict[str, trio.Lock] = collections.defaultdict(trio.Lock)
    self.bindings: dict[tuple[str, str], RemoteEnv] = {}
    self.load: collections.Counter = collections.Counter()  # (env, address) -> bound chains

  def dead(self) -> bool:
    return all(c.closed for c in self.connections.values())


@dataclasses.dataclass(eq=False)
class UsageMark:
  """`EnvManager.usage_mark()`: the counters and acquire-wait counts at the mark, and the most
  chains bound at once per env type since (kept up to date by the manager while the mark lives)."""

  counters: dict
  waits_seen: dict
  peaks: collections.Counter = dataclasses.field(default_factory=collections.Counter)


@dataclasses.dataclass(frozen=True)
class EnvUsage:
  """`EnvManager.usage_since(mark)`: acquire waits {env: [s, ...]}, peak bound chains {env: n},
  counter growth {counter: n}."""

  waits: dict
  peaks: dict
  counters: dict


class EnvManager:
  """Acquires env instances for chains across env servers (implements `EnvProvider`).

  Args:
    servers: addresses "host:port".
    acquire_wait_s: how long one server may hold an acquire while its pool is full.
    acquire_timeout_s: give up (EnvUnavailable) after backing off this long.
    max_backoff_s: cap of the exponential back-off between acquire rounds.
    call_timeout_s: optional client-side cap per call. Without it a call waits for the env's
      own limit (the server reports it at acquire; else `default_call_limit_s`) plus
      `reply_grace_s`; a call past that fails (an error observation for `step`), its connection
      is dropped, and the server is skipped for `down_retry_s` (a hung server cannot stall a run).
    reply_grace_s: also bounds how long an acquire waits for a reply beyond `acquire_wait_s`.
    down_retry_s: an unreachable server is skipped for this long before reconnecting.
    token: shared secret for the servers' handshake (default: $AGENTFLY_ENV_TOKEN(_FILE)).
    ssl_context: TLS to the servers (default: $AGENTFLY_ENV_TLS_CA names the CA file).
  """

  def __init__(
    self,
    servers: Sequence[str],
    *,
    acquire_wait_s: float = 0.5,
    acquire_timeout_s: float = 600.0,
    max_backoff_s: float = 2.0,
    call_timeout_s: float | None = None,
    connect_timeout_s: float = 5.0,
    reply_grace_s: float = 30.0,
    default_call_limit_s: float = 600.0,
    down_retry_s: float = 1.0,
    token: bytes | None | str = "from-env",
    ssl_context: Any = "from-env",
  ):
    if isinstance(servers, str):
      servers = [s for s in servers.split(",") if s.strip()]
    if not servers:
      raise ValueError("EnvManager needs at least one env server address (host:port)")
    for address in servers:
      parse_address(address)  # raises naming the bad address
    self.servers = [s.strip() for s in servers]
    self.acquire_wait_s = acquire_wait_s
    self.acquire_timeout_s = acquire_timeout_s
    self.max_backoff_s = max_backoff_s
    self.call_timeout_s = call_timeout_s
    self.reply_grace_s = reply_grace_s
    self.default_call_limit_s = default_call_limit_s
    self.connect_timeout_s = connect_timeout_s
    self.down_retry_s = down_retry_s
    self._token = auth.load_token() if token == "from-env" else token
    self._ssl_context = auth.default_client_ssl_context() if ssl_context == "from-env" else ssl_context
    self._states: dict[Any, _RunState] = {}
    self._down_until: dict[str, float] = {}
    self._connect_failed_at: dict[str, float] = {}  # the last failed connect per server
    self._not_serving: set[tuple[str, str]] = set()  # (address, env) pairs
    self._round_robin = itertools.count()
    self._counters = collections.Counter()
    self._backoff_s = 0.0
    self._peak_allocated = 0
    self._acquire_waits: dict[str, list[float]] = collections.defaultdict(list)  # every acquire's wait, in order
    self._marks: weakref.WeakSet[UsageMark] = weakref.WeakSet()  # live marks: each tracks its own peaks
    self._origin = self.usage_mark()  # usage_since(None): since this manager was made

  # -- EnvProvider --------------------------------------------------------------------------------

  async def acquire(self, env_name: str, chain_id: str) -> RemoteEnv:
    """The chain's instance of `env_name` (the same one until released)."""
    if not isinstance(env_name, str) or not env_name:
      raise TypeError(f"env_name must be a non-empty string, got {env_name!r}")
    chain_id = str(chain_id)
    state = self._state()
    existing = state.bindings.get((env_name, chain_id))
    if existing is not None:
      return existing
    address, connection, info = await self._bind(state, env_name, chain_id)
    env = RemoteEnv(self, state, env_name, chain_id, address, connection, info)
    winner = state.bindings.get((env_name, chain_id))
    if winner is not None:  # a concurrent acquire of the same chain won: give ours back
      if winner.address != address:
        try:
          await connection.call("release", {"env": env_name, "chain_id": chain_id}, timeout_s=30)
        except (ConnectionLost, RemoteError, trio.TooSlowError):
          pass
      return winner
    state.bindings[(env_name, chain_id)] = env
    state.load[(env_name, address)] += 1
    self._peak_allocated = max(self._peak_allocated, self._allocated_total())
    in_use = sum(1 for s in self._states.values() for name, _ in s.bindings if name == env_name)
    for mark in list(self._marks):
      mark.peaks[env_name] = max(mark.peaks[env_name], in_use)
    return env

  async def release(self, env_name: str, chain_id: str) -> None:
    """Gives the chain's instance back (the server resets or replaces it). Never raises."""
    state = self._state()
    env = state.bindings.pop((env_name, str(chain_id)), None)
    if env is not None:
      state.load[(env_name, env.address)] -= 1
    if env is None or env.connection.closed:
      return
    try:
      await env.connection.call("release", {"env": env_name, "chain_id": str(chain_id)}, timeout_s=30)
    except (ConnectionLost, RemoteError, trio.TooSlowError):
      pass  # the server releases a dead connection's chains by itself

  # -- reporting ----------------------------------------------------------------------------------

  def _allocated_total(self) -> int:
    return sum(len(s.bindings) for s in self._states.values())

  def metrics(self) -> dict[str, float]:
    """Flat float metrics: envs/allocated(/<env>), peak, back-off seconds, retries, errors."""
    per_env = collections.Counter(env for s in self._states.values() for env, _ in s.bindings)
    now = time.monotonic()
    out = {
      "envs/allocated": float(sum(per_env.values())),
      "envs/allocated_peak": float(self._peak_allocated),
      "envs/servers": float(len(self.servers)),
      "envs/servers_down": float(sum(1 for a in self.servers if self._down_until.get(a, 0) > now)),
      "envs/backoff_s": self._backoff_s,
    }
    for env_name, n in per_env.items():
      out[f"envs/allocated/{env_name}"] = float(n)
    for key in COUNTERS:
      out[f"envs/{key}"] = float(self._counters[key])
    return out

  def usage_mark(self) -> "UsageMark":
    """A snapshot of the client-side counters and acquire waits; `usage_since(mark)` reports
    what happened after it (reading resets nothing: several readers may hold marks)."""
    mark = UsageMark(counters=dict(self._counters), waits_seen={env: len(w) for env, w in self._acquire_waits.items()})
    self._marks.add(mark)
    return mark

  def usage_since(self, mark: "UsageMark | None") -> EnvUsage:
    """Since `mark` (None: since this manager was made), per env type: the seconds each acquire
    waited and the most chains bound at once; and how much each of `metrics()`'s counters
    (COUNTERS) grew."""
    mark = mark if mark is not None else self._origin
    waits = {env: list(w[mark.waits_seen.get(env, 0) :]) for env, w in self._acquire_waits.items()}
    return EnvUsage(
      waits={env: w for env, w in waits.items() if w},
      peaks=dict(mark.peaks),
      counters={key: self._counters.get(key, 0) - mark.counters.get(key, 0) for key in COUNTERS},
    )

  async def server_stats(self) -> dict[str, dict]:
    """Each server's `stats` reply (or {'error': ...} if unreachable)."""
    state, out = self._state(), {}
    for address in self.servers:
      try:
        out[address] = await (await self._connection(state, address)).call("stats", timeout_s=10)
      except (ConnectionLost, RemoteError, trio.TooSlowError) as e:
        out[address] = {"error": str(e)}
    return out

  async def aclose(self) -> None:
    """Closes this run's connections (the servers then free its chains' instances)."""
    state = self._state()
    for connection in state.connections.values():
      await connection.aclose()
    state.bindings.clear()
    state.load.clear()

  # -- internals ----------------------------------------------------------------------------------

  def _count(self, key: str, n: int = 1) -> None:
    self._counters[key] += n

  def _state(self) -> _RunState:
    try:
      token = trio.lowlevel.current_trio_token()
    except RuntimeError:
      raise RuntimeError(
        "EnvManager is trio-based: call it inside trio.run(...) (for one "
        "synchronous call use trio.run(env.step, action))"
      ) from None
    state = self._states.get(token)
    if state is None:
      for old_token, old in list(self._states.items()):  # drop runs that have ended
        if old.dead() and old.connections:
          del self._states[old_token]
      state = self._states[token] = _RunState(token)
    return state

  async def _connection(self, state: _RunState, address: str) -> Connection:
    connection = state.connections.get(address)
    if connection is not None and not connection.closed:
      return connection
    waiting_since = time.monotonic()
    async with state.connect_locks[address]:
      connection = state.connections.get(address)
      if connection is not None and not connection.closed:
        return connection
      failed_at = self._connect_failed_at.get(address)
      if failed_at is not None and failed_at >= waiting_since:
        # A connect that started while we waited for the lock just failed: do not try again
        # right away (a hung server would cost every waiting chain a connect timeout in turn).
        raise ConnectionLost(
          f"cannot connect to env server {address} (a connect attempt just "
          f"failed; it is retried after {self.down_retry_s:g} s)"
        )
      try:
        connection = await Connection.open(
          address, self.connect_timeout_s, token=self._token, ssl_context=self._ssl_context
        )
      except AuthenticationFailed:
        raise
      except ConnectionLost:
        self._connect_failed_at[address] = time.monotonic()
        self._down_until[address] = time.monotonic() + self.down_retry_s
        raise
      self._count("reconnects" if address in state.connections else "connects")
      # A (re)started server may serve other env types than before: learn them again.
      self._not_serving = {(a, e) for a, e in self._not_serving if a != address}
      self._down_until.pop(address, None)
      state.connections[address] = connection
      return connection

  def _candidates(self, state: _RunState, env_name: str) -> list[str]:
    now = time.monotonic()
    load = {a: state.load[(env_name, a)] for a in self.servers}
    up = [a for a in self.servers if (a, env_name) not in self._not_serving and self._down_until.get(a, 0) <= now]
    if not up:  # everything looks down: try them all anyway
      up = [a for a in self.servers if (a, env_name) not in self._not_serving]
    start = next(self._round_robin)
    order = {a: (i - start) % len(self.servers) for i, a in enumerate(self.servers)}
    return sorted(up, key=lambda a: (load[a], order[a]))

  def _release_if_bound(self, connection: Connection, env_name: str, chain_id: str):
    """For an acquire given up on (cancelled, timed out): if the server bound an instance anyway,
    release it (so a cancelled acquire never leaks an instance)."""

    async def release():
      try:
        await connection.call("release", {"env": env_name, "chain_id": chain_id}, timeout_s=30)
      except Exception:  # noqa: BLE001 -- best effort; a closed connection frees it anyway
        pass

    def on_reply(reply):
      if reply.get("ok") is True:
        self._count("abandoned_acquires")
        trio.lowlevel.spawn_system_task(release, name=f"release abandoned {env_name}/{chain_id}")

    return on_reply

  async def _bind(self, state: _RunState, env_name: str, chain_id: str):
    """Acquires an instance on some server, backing off while all are full or down."""
    started = time.monotonic()
    deadline = started + self.acquire_timeout_s
    backoff = 0.02
    last_error = "no server tried"
    while True:
      candidates = self._candidates(state, env_name)
      if not candidates:
        raise EnvUnavailable(f"no env server serves {env_name!r} (servers: {self.servers})")
      for address in candidates:
        try:
          connection = await self._connection(state, address)
          info = await connection.call(
            "acquire",
            {"env": env_name, "chain_id": chain_id, "wait_s": self.acquire_wait_s},
            timeout_s=self.acquire_wait_s + self.reply_grace_s,
            on_abandoned=self._release_if_bound(connection, env_name, chain_id),
          )
        except RemoteError as e:
          if e.error_type in (AUTH_REQUIRED, AUTH_FAILED):
            self._count("auth_failures")
            raise EnvUnavailable(
              f"env server {address} needs authentication: set "
              f"${auth.TOKEN_ENV} (or ${auth.TOKEN_FILE_ENV}) to its token; "
              f"it replied {e}"
            ) from e
          if e.error_type == UNKNOWN_ENV:
            self._not_serving.add((address, env_name))
          elif e.error_type == POOL_EXHAUSTED:
            self._count("pool_full")
          else:
            raise EnvUnavailable(f"acquire {env_name!r} on {address} failed: {e}") from e
          last_error = f"{address}: {e}"
          continue
        except AuthenticationFailed as e:
          self._count("auth_failures")
          raise EnvUnavailable(f"acquire {env_name!r} on {address}: {e}") from e
        except (ConnectionLost, trio.TooSlowError) as e:
          last_error = f"{address}: {e or 'no reply in time'}"
          self._count("connection_errors")
          if isinstance(e, trio.TooSlowError):  # a hung server: skip it for a while; the other calls
            self._down_until[address] = time.monotonic() + self.down_retry_s  # waiting on it are timeouts too
            await connection.aclose(hung_after_s=self.acquire_wait_s + self.reply_grace_s)
          continue
        self._count("acquires")
        self._acquire_waits[env_name].append(time.monotonic() - started)
        return address, connection, info
      if all((a, env_name) in self._not_serving for a in self.servers):
        raise EnvUnavailable(f"no env server serves {env_name!r} (servers: {self.servers}); last error: {last_error}")
      if time.monotonic() >= deadline:
        raise EnvUnavailable(
          f"could not acquire {env_name!r} for chain {chain_id!r} within "
          f"{self.acquire_timeout_s:g} s; last error: {last_error}"
        )
      pause = min(backoff, self.max_backoff_s) * (0.5 + random.random())
      self._count("acquire_retries")
      self._backoff_s += pause
      await trio.sleep(pause)
      backoff *= 2
