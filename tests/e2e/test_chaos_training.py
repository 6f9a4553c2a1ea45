"""Chaos test of a training run: the real Trainer (GRPO updates, the paged engine, the shipped lookup
warm start as the policy) against two real env-server processes, through the agent's EnvManager.

The task is the lookup demo with its tool made env-bound: `lookup(key)` takes a `sleep` env
(server-side sleep, then the lookup tool's answer), so the warm-started policy, which calls
`lookup` in part of its chains, drives real env calls. One 5-step run:
  step 1  server a SIGKILLed while chains are inside a call on it: a's calls are tool errors
  step 2  a is down: every chain goes to b, no errors
  step 3  a restarted on its port: the manager uses it again
  step 4  b frozen (SIGSTOP: it accepts, never answers): its calls are timeouts (the first call
          unanswered past its limit closes the connection as hung; the others on it time out
          with it, none is a lost connection); the step finishes
  step 5  b still frozen: every chain goes to a, no errors
and every step's metrics are finite and the policy's params moved.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time

import jax
import numpy as np
import pytest
import trio

from agentfly_jax import tool
from agentfly_jax.envs import EnvManager
from agentfly_jax.rl.config import lookup_config
from agentfly_jax.rl.trainer import Trainer
from agentfly_jax.tasks import Task, lookup
from envservers_helpers import busy, kill, restart_on_port, running_server, server_stats, steps_started, wait_until
from train_cli import ROOT

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow, pytest.mark.fast_compile]
SERVER = ("sleep=32:2",)
ENV_LIMIT = ("--call-timeout-s", "sleep=3")  # the env's own limit; the client adds 1 s grace
NAP_S = {1: 1.5, 4: 1.0}  # the kill / freeze steps; else 0.05


class Chaos:
  """What the test does to the servers before each training step, and what the tool saw."""

  def __init__(self, a, b, manager):
    self.a, self.b, self.manager = a, b, manager
    self.restarted = None
    self.step = 0
    self.calls: list[dict] = []  # one per env call: step, server, error, observation, seconds
    self.watcher = None
    self.b_acquires = {}

  def before_step(self, step: int) -> None:
    if self.watcher is not None:  # the previous step's signal must have been sent
      assert self.watcher.finish(), (f"step {step - 1}: no chain was inside a call to signal", self.calls)
      self.watcher = None
    if step in (2, 3):  # b's own count of acquires around step 2
      self.b_acquires[step] = trio.run(server_stats, self.b.address)["pools"]["sleep"]["acquires"]
    if step == 1:
      self.watcher = SignalWhenBusy(self.a, signal.SIGKILL)
    elif step == 2:
      self.a.process.wait(10)
    elif step == 3:
      self.restarted = restart_on_port(self.a, *SERVER, extra=ENV_LIMIT)
      deadline = time.monotonic() + 30  # until the manager's back-off on a's address is over
      while self.manager.metrics()["envs/servers_down"] and time.monotonic() < deadline:
        time.sleep(0.05)
    elif step == 4:
      self.watcher = SignalWhenBusy(self.b, signal.SIGSTOP)
    self.step = step

  def on(self, step: int) -> list[dict]:
    return [c for c in self.calls if c["step"] == step]

  def close(self):
    if self.watcher is not None:
      self.watcher.finish()
    kill(self.b.process.pid, signal.SIGCONT)
    if self.restarted is not None:
      self.restarted.stop()


class SignalWhenBusy:
  """A thread that sends `sig` to a server once one of its chains is inside a `step` started
  after this was made (polling its `stats`), unless `finish()` stops it first; `finish()` says
  whether it sent it."""

  def __init__(self, server, sig):
    self.server, self.sig, self.fired = server, sig, False
    self.steps_before = steps_started(trio.run(server_stats, server.address))
    self._stop = threading.Event()
    self._thread = threading.Thread(target=trio.run, args=(self._watch,), daemon=True)
    self._thread.start()

  async def _watch(self):
    while not self._stop.is_set():
      if await busy(self.server.address, "sleep", self.steps_before):
        kill(self.server.process.pid, self.sig)
        self.fired = True
        return
      await trio.sleep(0.02)

  def finish(self) -> bool:
    self._stop.set()
    self._thread.join(30)
    return self.fired


def _task(chaos: Chaos, manager: EnvManager) -> Task:
  @tool(name="lookup", env="sleep")
  async def env_lookup(key: str, env) -> str:
    """Looks up the secret code of a key (in a remote environment).

    Args:
      key: the key.
    """
    start = time.monotonic()
    result = await env.step({"sleep_s": NAP_S.get(chaos.step, 0.05)})
    error = result.info.get("error")
    chaos.calls.append(
      dict(
        step=chaos.step,
        server=env.address,
        error=error,
        observation=result.observation,
        seconds=time.monotonic() - start,
      )
    )
    if error:  # a failed call is a tool error (rollout/tool_errors/lookup)
      raise RuntimeError(result.observation)
    return lookup.lookup.fn(key)

  return Task(
    tools=[env_lookup],
    reward=lookup.code_match,
    rows=lookup.make_rows(64, seed=0),
    system_prompt=lookup.SYSTEM_PROMPT,
    agent_factory=lambda tok: lookup.make_agent(tok, tools=[env_lookup], env_provider=manager),
  )


def _config():
  c = lookup_config("grpo", os.path.join(ROOT, "experiments", "results", "lookup_warmstart"))
  c.train.steps = 5
  c.rollout.rows_per_step, c.rollout.num_chains, c.rollout.max_turns = 8, 4, 2
  c.rollout.max_tokens_per_turn, c.rollout.max_total_tokens = 24, 128
  c.rollout.max_batch_size = c.train.micro_batch_size = 32
  c.rollout.sampler = "jax"  # the engine: chains run concurrently, so several calls wait on a frozen server at once
  c.eval.every, c.eval.num_rows = 0, 0
  c.checkpoint.every = 100
  c.log.tensorboard = c.log.progress = False
  return c


def _finite(record: dict) -> bool:
  return all(math.isfinite(v) for v in record.values() if isinstance(v, (int, float)))


def test_training_run_survives_killed_restarted_and_frozen_env_servers(tmp_path):
  with running_server(*SERVER, extra=ENV_LIMIT) as a, running_server(*SERVER, extra=ENV_LIMIT) as b:
    manager = EnvManager(
      [a.address, b.address], token=None, down_retry_s=0.3, reply_grace_s=1, connect_timeout_s=2, acquire_timeout_s=120
    )
    chaos = Chaos(a, b, manager)
    try:
      trainer = Trainer(_config(), str(tmp_path), task=_task(chaos, manager))
      # One static batch and prompt size: the faults change how requests batch, and every new
      # shape would be another compilation of the sampler.
      sampler = trainer.run.parts.sampler
      sampler.batch_buckets, sampler.prompt_buckets = (sampler.max_batch_size,), (sampler.max_len,)
      records = trainer.train(before_step=chaos.before_step)  # the faults, injected before each step
      a2 = chaos.restarted.address
      assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
      assert all(_finite(r) for r in records)
      by_step = {r["step"]: r for r in records}
      assert all(by_step[s]["rollout/tool_calls/lookup"] > 0 for s in by_step)

      # Step 1: a's chains got error observations (a tool error each); b's calls went through.
      failed = [c for c in chaos.on(1) if c["error"]]
      assert failed and all(c["server"] == a.address for c in failed), chaos.on(1)
      assert all("unavailable" in c["observation"] for c in failed), failed
      assert any(c["server"] == b.address and not c["error"] for c in chaos.on(1))
      assert by_step[1]["rollout/tool_errors/lookup"] >= len(failed) / 32
      assert by_step[1]["env/client/connection_errors"] >= len(failed)  # the trainer's own count

      # Step 2: a is down; every chain went to b (b's own count of acquires says so too).
      assert chaos.on(2) and all(c["server"] == b.address and not c["error"] for c in chaos.on(2))
      assert chaos.b_acquires[3] - chaos.b_acquires[2] == by_step[2]["env/sleep/acquires"] > 0
      assert by_step[2]["rollout/tool_errors/lookup"] == 0
      # (Whether a chain tried a's port again in step 2 depends on the machine's speed: a is
      # skipped while it is marked down, down_retry_s after its last refused connect.)
      assert by_step[2]["env/client/timeouts"] == 0

      # Step 3: a restarted on its port is used again.
      assert a2 == a.address
      assert any(c["server"] == a2 for c in chaos.on(3))
      assert all(not c["error"] for c in chaos.on(3))
      assert by_step[3]["env/client/connects"] >= 2  # to both servers

      # Step 4: b frozen; its calls are timeouts, never a lost connection: the first call on b to go unanswered
      # past its limit (a step: the env's 3 s + 1 s reply grace; an acquire: its wait + grace) closes the
      # connection as hung, and every call still waiting on it is a timeout too.
      timed_out = [c for c in chaos.on(4) if c["error"]]
      assert timed_out and all(c["server"] == b.address and c["error"] == "Timeout" for c in timed_out), chaos.on(4)
      assert all("within 4 s" in c["observation"] or "stopped answering" in c["observation"] for c in timed_out)
      assert 1.0 <= max(c["seconds"] for c in timed_out) < 15  # waited for b until it was found hung
      assert by_step[4]["rollout/tool_errors/lookup"] > 0
      assert by_step[4]["env/client/timeouts"] >= len(timed_out)

      # Step 5: b still frozen; every chain went to a, no errors.
      assert chaos.on(5) and all(c["server"] == a2 and not c["error"] for c in chaos.on(5))
      assert by_step[5]["rollout/tool_errors/lookup"] == 0
      assert by_step[5]["env/client/timeouts"] == 0

      # Training really ran: the policy's params moved.
      moved = [
        not np.array_equal(x, y)
        for x, y in zip(jax.tree.leaves(trainer.run.parts.policy.params), jax.tree.leaves(trainer.state.params))
      ]
      assert any(moved)

      # No instance leaked on the restarted server: every acquire is released.
      async def all_released():
        pool = (await server_stats(a2))["pools"]["sleep"]
        return pool["acquires"] == pool["releases"] > 0 and pool["in_use"] == 0

      trio.run(wait_until, all_released)
    finally:
      chaos.close()
