"""Shared by the endpoint tests (tests/agents/test_agents_endpoint.py, tests/e2e/
test_agents_endpoint_train.py): the warm-started lookup policy, the lookup demonstration policy as a
sampler script, and the check that a trajectory's model-written tokens are exactly the sampler's outputs."""

import os

import numpy as np
from train_cli import ROOT

from agentfly_jax.tasks import lookup

WARMSTART = os.path.join(ROOT, "experiments", "results", "lookup_warmstart")


def lookup_script(tok):
  """The lookup demonstration policy as a sampler script: a tool call, then the copied code."""
  eot = tok.token_to_id("<|im_end|>")

  def script(prompt_ids):
    reply = lookup.scripted_response(tok.decode(prompt_ids), True, np.random.default_rng(0))
    return tok.encode(reply if isinstance(reply, str) else "".join(p for p, _ in reply)) + [eot]

  return script


def assert_segment_is_sampler_output(traj, calls):
  """Each run of masked-in ids is exactly one sampler call's output (ids and log-probs) for a
  prompt equal to the trajectory up to there; nothing else is masked in."""
  ids, mask, logps = traj.token_ids.tolist(), traj.action_mask, traj.sampler_logprobs
  by_prompt = {}
  for p, r in calls:
    by_prompt.setdefault(len(p), []).append((p, r))
  spans, t = [], 0
  while t < len(ids):
    if mask[t]:
      end = t
      while end < len(ids) and mask[end]:
        end += 1
      spans.append((t, end))
      t = end
    else:
      t += 1
  assert spans, "no masked-in tokens"
  for start, end in spans:
    assert any(
      p == ids[:start] and r.token_ids == ids[start:end] and np.array_equal(np.float32(r.logprobs), logps[start:end])
      for p, r in by_prompt.get(start, ())
    ), f"span {start}:{end} is no sampler call's output"
  assert np.all(logps[~mask] == 0)
