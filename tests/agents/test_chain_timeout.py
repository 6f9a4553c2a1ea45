"""Every rollout has a chain timeout (rollout.chain_timeout_s): a chain past it ends with finish "timeout",
counted in the rollout metrics and as a failed chain by the guard; an outside harness's whole process tree
(a detached daemon included) is dead when its chain ends, and a daemon holding the harness's stdout open
does not hold the chain."""

import os
import sys
import threading
import time
import uuid

import pytest
import trio

from agentfly_jax.agents import load_tokenizer, run_rollout
from agentfly_jax.agents.endpoint_rollout import run_endpoint_rollout
from agentfly_jax.agents.harness import command_agent
from agentfly_jax.rl import stages
from agentfly_jax.rl.batching import rollout_metrics
from agentfly_jax.rl.chain_failures import ChainFailureGuard, ChainsFailedError, error_share
from agentfly_jax.rl.spec import RolloutSection
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.tasks import lookup

from endpoint_testlib import WARMSTART, lookup_script
from envservers_helpers import sandbox_unavailable_reason

HOSTILE = os.path.join(os.path.dirname(__file__), "harness_hostile.py")
NO_SANDBOX = sandbox_unavailable_reason()
SANDBOXES = [pytest.param("bwrap", marks=pytest.mark.skipif(NO_SANDBOX is not None, reason=str(NO_SANDBOX))), "off"]


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer(WARMSTART)


@pytest.fixture(scope="module")
def agent(tok):
  return lookup.make_agent(tok)


class HangsAfterFirstTurn(ScriptedSampler):
  """The lookup demo for the first request; every later request never returns."""

  async def agenerate(self, prompt, params):
    if self.calls:
      await trio.sleep_forever()
    return await super().agenerate(prompt, params)


def _pids_with(marker: str) -> list[int]:
  """The host pids whose command line holds `marker`."""
  out = []
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        with open(f"/proc/{name}/cmdline", "rb") as f:
          if marker.encode() in f.read().split(b"\0"):
            out.append(int(name))
      except OSError:
        pass
  return out


def _rollout_watching(marker: str, **kwargs):
  """run_endpoint_rollout in a thread; meanwhile the pids of the daemon carrying `marker` (from the host's /proc).
  Returns (trajectories, daemon pids, wall seconds)."""
  out, seen = {}, set()

  def go():
    start = time.monotonic()
    out["trajs"] = run_endpoint_rollout(**kwargs)
    out["wall"] = time.monotonic() - start

  thread = threading.Thread(target=go)
  thread.start()
  while thread.is_alive():
    seen |= set(_pids_with(marker))
    time.sleep(0.02)
  thread.join()
  return out["trajs"], sorted(seen), out["wall"]


def test_a_builtin_chain_past_its_timeout_ends_as_timeout_and_keeps_its_first_turn(tok, agent):
  start = time.monotonic()
  [t] = run_rollout(agent, lookup.make_rows(1, 0), sampler=HangsAfterFirstTurn(lookup_script(tok)), chain_timeout_s=1.0)
  assert time.monotonic() - start < 10
  assert (t.finish_reason, t.num_turns, t.error) == ("timeout", 1, None)
  assert int(t.action_mask.sum()) > 0 and len(t.tool_calls) == 1  # the turn before the hang is kept
  metrics = rollout_metrics([t])
  assert metrics["rollout/finish/timeout"] == 1.0
  with pytest.raises(ChainsFailedError, match=r"every chain failed \(1 of 1 finish=timeout\).*chain_timeout_s"):
    ChainFailureGuard().check(3, [t])


def test_the_run_spec_timeout_reaches_the_rollout(tok, agent):
  spec = RolloutSection(num_chains=2, rows_per_step=1, max_tokens_per_turn=64, max_total_tokens=512, chain_timeout_s=1)
  start = time.monotonic()
  trajs = stages.rollout(
    agent,
    lookup.make_rows(1, 0),
    sampler=HangsAfterFirstTurn(lookup_script(tok)),
    rollout_spec=spec,
    end_of_turn_id=tok.token_to_id("<|im_end|>"),
    env_provider=None,
  )
  assert time.monotonic() - start < 10
  assert [t.finish_reason for t in trajs] == ["timeout", "timeout"]
  assert error_share(trajs)[0] == 1.0


def test_chain_timeout_must_be_positive_and_finite(tok, agent):
  assert RolloutSection().chain_timeout_s == 600.0
  for bad in (0, -1, float("inf"), float("nan")):
    with pytest.raises(ValueError, match=r"config.rollout.chain_timeout_s=.*: must be a number of seconds > 0"):
      RolloutSection(chain_timeout_s=bad)
  with pytest.raises(ValueError, match="rollout: chain_timeout_s must be a finite number of seconds > 0, got 0"):
    run_rollout(agent, lookup.make_rows(1, 0), sampler=ScriptedSampler(lookup_script(tok)), chain_timeout_s=0)
  with pytest.raises(ValueError, match="endpoint_rollout: chain_timeout_s must be .* got None"):
    run_endpoint_rollout(
      agent,
      lookup.make_rows(1, 0),
      command_agent([sys.executable, HOSTILE], sandbox="off"),
      sampler=None,
      chain_timeout_s=None,
    )


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_hanging_harness_is_killed_with_its_detached_daemon_at_the_timeout(tok, agent, sandbox):
  marker = f"agentfly-test-daemon-{uuid.uuid4().hex}"
  [t], daemons, wall = _rollout_watching(
    marker,
    agent=agent,
    rows=lookup.make_rows(1, 0),
    agent_fn=command_agent([sys.executable, HOSTILE, "hang", marker], sandbox=sandbox),
    sampler=ScriptedSampler(lookup_script(tok)),
    chain_timeout_s=3.0,
  )
  assert (t.finish_reason, t.num_turns) == ("timeout", 1)
  assert 3.0 <= wall < 3.0 + 10, wall  # + starting the harness, stopping its tree and the endpoint (a busy CPU)
  assert daemons, "the harness's daemon was never seen running"
  assert not _pids_with(marker), f"the harness's daemon {daemons} outlived its chain"
  assert rollout_metrics([t])["rollout/finish/timeout"] == 1.0


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_daemon_holding_the_harness_stdout_does_not_hold_its_chain(tok, agent, sandbox):
  marker = f"agentfly-test-daemon-{uuid.uuid4().hex}"
  [t], daemons, wall = _rollout_watching(
    marker,
    agent=agent,
    rows=lookup.make_rows(1, 0),
    agent_fn=command_agent([sys.executable, HOSTILE, "daemon", marker], sandbox=sandbox),
    sampler=ScriptedSampler(lookup_script(tok)),
    chain_timeout_s=60.0,
  )
  assert t.finish_reason == "agent_done", t.error
  assert t.prediction == "the harness's answer"  # its stdout, read to the end
  assert wall < 20, f"the chain waited {wall:.1f} s on a daemon holding stdout (it sleeps 300 s)"
  assert daemons, "the harness's daemon was never seen running"
  assert not _pids_with(marker), f"the harness's daemon {daemons} outlived its chain"


def test_a_harness_flooding_stdout_and_stderr_keeps_only_what_the_chain_needs(tok, agent):
  [t] = run_endpoint_rollout(
    agent,
    lookup.make_rows(1, 0),
    command_agent([sys.executable, HOSTILE, "flood", "64"], sandbox="off", max_answer_bytes=1 << 16),
    sampler=ScriptedSampler(lookup_script(tok)),
    chain_timeout_s=60.0,
  )
  assert t.finish_reason == "agent_done", t.error
  assert t.prediction == "x" * (1 << 16)  # the first max_answer_bytes of 64 MB
