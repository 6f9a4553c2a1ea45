"""Chaos tests of a run against real env-server processes: rollouts (the real `rollout`, a
scripted sampler, a stateful tool on a `sleep` env) over two servers while one is SIGKILLed
mid-step and restarted on its port, or frozen (SIGSTOP: it accepts but never answers)."""

from __future__ import annotations

import signal
import time

import pytest
import trio

from agent_testlib import hermes_call, tokenizer_dir
from agentfly_jax import tool
from agentfly_jax.agents import ToolCallAgent, rollout
from agentfly_jax.envs import EnvManager
from agentfly_jax.sampling.scripted import ScriptedSampler
from envservers_helpers import kill, restart_on_port, running_server, server_stats, signal_when_busy, wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
ROWS = [{"question": f"q{i}"} for i in range(4)]
CHAINS = len(ROWS) * 2


@tool(env="sleep")
async def nap(seconds: float, env) -> str:
  """Sleeps inside the environment.

  Args:
    seconds: how long to sleep.
  """
  return (await env.step({"sleep_s": seconds})).observation


def _agent():
  return ToolCallAgent(tokenizer_dir("qwen2.5"), tools=[nap])


async def _run_step(agent, manager, seconds: float) -> list[str]:
  """One rollout step (8 chains: a `nap` call, then a final answer); the tool observations."""

  def script(prompt):
    turns = agent.tokenizer.decode(prompt).count("<|im_start|>assistant") - 1
    text = hermes_call("nap", {"seconds": seconds}) if turns == 0 else "done"
    return agent.tokenizer.encode(text + "<|im_end|>")

  trajectories = await rollout(
    agent, ROWS, sampler=ScriptedSampler(script), num_chains=2, max_turns=2, env_provider=manager
  )
  assert len(trajectories) == CHAINS and all(t.finish_reason for t in trajectories)
  return [t.tool_calls[0]["observation"] for t in trajectories]


def _slept(observations: list[str]) -> int:
  """Chains whose nap ran: "slept", possibly after the note of a chain that was moved to a fresh
  environment because its connection had been closed before its call was sent."""
  return sum(o == "slept" or (o.endswith("\nslept") and "state is gone" in o) for o in observations)


@pytest.mark.trio
async def test_run_survives_a_killed_server_and_uses_it_again_after_restart():
  agent = _agent()
  with running_server("sleep=8:2") as a, running_server("sleep=8:2") as b:
    manager = EnvManager([a.address, b.address], token=None, down_retry_s=0.3, acquire_timeout_s=60)
    assert await _run_step(agent, manager, 0.05) == ["slept"] * CHAINS
    assert (await server_stats(a.address))["pools"]["sleep"]["acquires"] > 0
    b_before = (await server_stats(b.address))["pools"]["sleep"]["acquires"]

    # Step 2: server a is SIGKILLed while its chains are inside `step`.
    observations = {}
    async with trio.open_nursery() as nursery:

      async def step():
        observations["step2"] = await _run_step(agent, manager, 1.5)

      nursery.start_soon(step)
      await signal_when_busy(a)
    a.process.wait(10)
    errors = [o for o in observations["step2"] if o.startswith("Error")]
    assert errors and len(errors) < CHAINS, observations  # a's chains only
    assert all("unavailable" in o for o in errors)
    assert _slept(observations["step2"]) == CHAINS - len(errors)

    # Step 3: a is down; every new chain goes to b and the step is clean.
    b_mid = (await server_stats(b.address))["pools"]["sleep"]["acquires"]
    assert await _run_step(agent, manager, 0.05) == ["slept"] * CHAINS
    assert (await server_stats(b.address))["pools"]["sleep"]["acquires"] - b_mid == CHAINS
    assert b_mid > b_before

    # a restarts on its port: after down_retry_s the manager spreads chains over both again.
    restarted = restart_on_port(a, "sleep=8:2")
    try:

      async def both_up():
        return manager.metrics()["envs/servers_down"] == 0

      await wait_until(both_up)
      assert await _run_step(agent, manager, 0.05) == ["slept"] * CHAINS
      assert (await server_stats(restarted.address))["pools"]["sleep"]["acquires"] >= CHAINS // 4
      assert manager.metrics()["envs/reconnects"] >= 1
    finally:
      await manager.aclose()
      restarted.stop()


@pytest.mark.trio
async def test_a_hung_server_costs_its_calls_the_env_limit_and_the_run_goes_on():
  agent = _agent()
  with running_server("sleep=8:2", extra=("--call-timeout-s", "sleep=1")) as a, running_server("sleep=8:2") as b:
    manager = EnvManager(
      [a.address, b.address], token=None, down_retry_s=60, reply_grace_s=1, connect_timeout_s=1, acquire_timeout_s=60
    )
    try:
      observations = {}
      start = time.monotonic()
      async with trio.open_nursery() as nursery:

        async def step():
          observations["step1"] = await _run_step(agent, manager, 0.6)

        nursery.start_soon(step)
        await signal_when_busy(a, signal.SIGSTOP)  # accepts connections, never answers
      elapsed = time.monotonic() - start
      timeouts = [o for o in observations["step1"] if o.startswith("Error (Timeout)")]
      assert timeouts and len(timeouts) < CHAINS, observations
      assert "within 2 s" in timeouts[0]  # a's 1 s env limit + the 1 s reply grace
      # Every call that waited on the frozen server is a timeout (one call's timeout closes the
      # shared connection; the calls still waiting on it are timeouts too, not lost connections).
      assert [o for o in observations["step1"] if o.startswith("Error")] == timeouts
      assert _slept(observations["step1"]) == CHAINS - len(timeouts)
      assert elapsed < 20
      # The next step runs entirely on b.
      b_before = (await server_stats(b.address))["pools"]["sleep"]["acquires"]
      assert await _run_step(agent, manager, 0.05) == ["slept"] * CHAINS
      assert (await server_stats(b.address))["pools"]["sleep"]["acquires"] - b_before == CHAINS
      assert manager.metrics()["envs/timeouts"] == len(timeouts)
    finally:
      kill(a.process.pid, signal.SIGCONT)
      await manager.aclose()
