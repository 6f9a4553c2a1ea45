"""The step's stages (rl/stages.py) return what they make: the weight sync its bytes (from the
sampler's SyncStats, or counted when the sampler does not say), the row stream its rows."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentfly_jax.agents.trajectory import Trajectory
from agentfly_jax.models import CausalLM, tiny_config
from agentfly_jax.rl import stages
from agentfly_jax.sampling import JaxSampler, SyncStats


class _SilentSampler:
  """A sampler whose update_weights returns nothing (the protocol allows it)."""

  def __init__(self):
    self.pushes = 0

  def update_weights(self, params):
    self.pushes += 1


def test_sync_reports_the_bytes_the_push_moved():
  model = CausalLM(
    tiny_config(
      "qwen2",
      vocab_size=64,
      num_hidden_layers=1,
      hidden_size=32,
      intermediate_size=64,
      num_attention_heads=1,
      num_key_value_heads=1,
    ),
    rngs=nnx.Rngs(0),
  )
  params = nnx.state(model, nnx.Param)
  nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  jax_weights = stages.SamplerWeights(JaxSampler(model, max_batch_size=2, max_len=32, pad_id=0, kernel_layout="in_out"))
  new = jax.tree.map(lambda x: x + 1.0, params)
  assert stages.sync(jax_weights, new) == {"sync/bytes": float(nbytes)}  # the sampler's own count
  assert stages.sync(jax_weights, new) == {"sync/bytes": 0.0}  # it already holds them
  assert jax_weights.loaded is new
  silent = _SilentSampler()
  weights = stages.SamplerWeights(silent)
  stats = weights.load(params)
  assert isinstance(stats, SyncStats) and stats.bytes == nbytes and silent.pushes == 1
  assert weights.load(params) is None and silent.pushes == 1


def _traj(group, reward, n_gen):
  ids = np.arange(8)
  mask = np.zeros(8, bool)
  mask[8 - n_gen :] = True
  return Trajectory(
    token_ids=ids,
    action_mask=mask,
    sampler_logprobs=np.where(mask, -0.5, 0),
    reward=reward,
    group_id=group,
    finish_reason="no_tool_call",
    num_turns=1,
    tool_calls=[],
  )


def test_step_arrays_returns_the_arrays_that_train_and_the_rollout_metrics():
  trajs = [_traj(0, 1.0, 3), _traj(0, 1.0, 2), _traj(1, 0.0, 4), _traj(1, 1.0, 1)]
  arrays, metrics = stages.step_arrays(trajs, pad_id=0, dynamic_sampling=True)
  assert metrics["dapo/groups_dropped"] == 1 and metrics["rollout/reward_mean"] == 0.75
  assert metrics["rollout/num_chains"] == 4  # measured before the drop
  np.testing.assert_array_equal(arrays["group_ids"], [1, 1])
  np.testing.assert_array_equal(arrays["action_mask"].sum(axis=1), [4, 1])
  arrays, metrics = stages.step_arrays(trajs, pad_id=0, dynamic_sampling=False)
  assert len(arrays["group_ids"]) == 4 and "dapo/groups_dropped" not in metrics
  arrays, metrics = stages.step_arrays(trajs[:2], pad_id=0, dynamic_sampling=True)
  assert arrays is None and metrics["dapo/groups_dropped"] == 1  # nothing left to train


def test_update_with_nothing_to_train_keeps_the_state():
  state = {"w": jnp.ones(3)}
  new, metrics = stages.update(None, state, None, None, step=1)
  assert new is state and metrics == {}
  np.testing.assert_array_equal(new["w"], np.ones(3))


def test_a_rollout_runs_at_most_a_training_steps_chains_at_once(monkeypatch):
  """Evaluations too (more rows than a step): the env pools are sized for a step's chains, and a chain that
  waits on a full pool past the acquire timeout fails (the shop's 64 test goals at once on 32 instances did)."""
  import importlib

  from agentfly_jax.rl.spec import RolloutSection

  rollout_lib = importlib.import_module("agentfly_jax.agents.rollout")  # (the package re-exports a `rollout`)

  seen = {}

  def fake_run_rollout(agent, rows, **kw):
    seen.update(kw, rows=len(rows))
    return []

  monkeypatch.setattr(rollout_lib, "run_rollout", fake_run_rollout)
  rng = np.random.default_rng(2)
  rows_per_step, num_chains = int(rng.integers(2, 9)), int(rng.integers(2, 5))
  spec = RolloutSection(rows_per_step=rows_per_step, num_chains=num_chains)
  rows = [{"i": i} for i in range(5 * rows_per_step)]
  kw = dict(sampler=None, rollout_spec=spec, end_of_turn_id=0, env_provider=None)
  stages.rollout(None, rows, num_chains=1, temperature=0.0, **kw)
  assert (seen["rows"], seen["num_chains"], seen["concurrency"]) == (len(rows), 1, rows_per_step * num_chains)
  stages.rollout(None, rows, **kw, seed=1)
  assert seen["concurrency"] == rows_per_step * num_chains
  small = RolloutSection(rows_per_step=rows_per_step, num_chains=num_chains, concurrency=3)
  stages.rollout(None, rows, **{**kw, "rollout_spec": small})
  assert seen["concurrency"] == 3  # a smaller setting holds
