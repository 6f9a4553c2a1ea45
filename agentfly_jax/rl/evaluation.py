"""A run's greedy evaluation: one chain per row at temperature 0 on its eval (dev) rows, eval/* metrics.

    metrics = evaluate(run, params)                  # the loop: step 0 (and before the SFT warm start
    metrics = evaluate(run, params, rows, seed=3)    #   when eval.before_sft) and every eval.every steps

The eval rows are the task's dev split (`make_eval_rows`); the locked test split is read only by
experiments/learning_report.py. The sampler's lock is held for the whole evaluation, so an async
producer never samples with the evaluated params; its own weights are put back after.
"""

from __future__ import annotations

from agentfly_jax.rl import stages
from agentfly_jax.rl.run import Run, rollout


def evaluate(run: Run, params, rows=None, *, seed=0) -> dict:
  """Greedy single-chain rollout of `rows` (default the run's eval rows) -> eval/* metrics (pushes
  `params` to the sampler unless it holds them; an async rollout's weights are put back after)."""
  rows = rows or run.parts.eval_rows
  return stages.evaluate(
    run.weights,
    params,
    lambda: rollout(run, rows, num_chains=1, temperature=0.0, seed=seed),
    restore=run.spec.asynchronous,
  )
