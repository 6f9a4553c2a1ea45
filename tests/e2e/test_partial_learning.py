"""Partial rollouts still learn the demo: the short GRPO run of test_learning.py in async mode with
partial rollouts (chains span policy versions, groups carry over steps, decoupled PPO with per-token
behaviour log-probs) makes the greedy policy call the tool and copy the code.

The learning rate is 3e-4, not the synchronous demo's 5e-4: with one-step-stale batches at 5e-4 the
lookup policy often learns to ramble in its answer turn after a few steps (the turn runs to
max_tokens_per_turn, sampled success falls back to 0.0-0.2 by step 12, once the greedy policy too),
with or without partial rollouts (measured 2026-11-29 on a 2-core CPU from the old warm start of one-token keys,
12 steps, max_staleness 1:
async without partial 1 of 3 seeds, partial 4 of 6 runs; synchronous runs and max_staleness 0 none).
At 3e-4 the greedy policy failed in 1 of 4 partial seeds (rambling came in 3; seed 0, this test's, none). It is the recipe's, made more
frequent by staleness: an exactly on-policy partial run (max_staleness 0) rambled once too;
lab/results/partial_stability.md. From today's warm start (three-syllable keys) the rambling is
a transient of the guess branch RL leaves, in every mode: the wrong code words go within ~4 steps, the branch then
repeats `The code is` to the turn cap while the first token moves to the tool call more slowly; the cut chains peak
at steps 6-9 and recede by step ~20 (3 seeds run to 24 steps: sampled success 0.59-0.92 at step 24). A cut-turn
penalty, halved negative advantages and a lower lr did not shorten it. So this 12-step test (CI time) asserts the
greedy policy and the staleness bound (every trained turn within it), not the sampled chains, which stop at the
transient's peak."""

import importlib.util
import os

import pytest
from train_cli import ROOT

pytestmark = pytest.mark.fast_compile  # compile-bound (tests/conftest.py)


@pytest.mark.slow
def test_partial_rollouts_learn_to_use_the_tool(tmp_path):
  from agentfly_jax.rl.trainer import Trainer

  spec = importlib.util.spec_from_file_location("cfg", os.path.join(ROOT, "configs", "lookup_grpo.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  config = mod.get_config()
  config.train.steps = 12
  config.rollout.mode, config.rollout.max_staleness, config.rollout.partial = "async", 1, True
  config.train.lr = 3e-4  # stale batches: see the module docstring
  config.eval.every = 12  # greedy eval at step 0 and step 12
  config.eval.num_rows = 32
  config.checkpoint.every = 0
  config.log.tensorboard = config.log.progress = False
  records = Trainer(config, str(tmp_path / "run")).train()
  greedy = {r["step"]: r["eval/success_rate"] for r in records if "eval/success_rate" in r}
  tool_use = [r["rollout/tool_calls_per_chain"] for r in records if "rollout/tool_calls_per_chain" in r]
  assert sorted(greedy) == [0, 12] and len(tool_use) == 12
  assert greedy[0] <= 0.5, greedy
  # from the current warm start, 8 runs of this test at 3e-4: greedy at step 12 0.59-0.97 in the 6 read, >= 0.5
  # in the other 2; from step 0's 0.00 any of them is learning. The synchronous test_learning.py keeps >= 0.8.
  assert greedy[12] >= 0.5, greedy
  # Not asserted: the sampled chains. At step 12 they sit at the peak of the guess branch's transient (the cut
  # chains recede by step ~20: lab/results/partial_stability.md); the greedy policy learned in every run.
  # Every trained turn within the bound, none masked (the producer schedules by deadline and asserts it).
  steps = [r for r in records if "async/staleness" in r]
  assert len(steps) == 12
  for r in steps:
    assert r["async/staleness"] <= 1 and r["async/staleness_hist/0"] + r["async/staleness_hist/1"] == pytest.approx(
      1
    ), r
