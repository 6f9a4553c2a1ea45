"""experiments/learning_report.py without training: the counted-checkpoint rule, the table, and the
shop config's defaults being the recipe that worked (attempt u's recorded config)."""

import json
import os

import pytest
from train_cli import ROOT, load_script

from agentfly_jax.rl.config import config_beside, default_config, validate_config


@pytest.fixture(scope="module")
def report():
  return load_script("experiments/learning_report.py")


def _records(step_s):
  return [{"step": 0}] + [{"step": i + 1, "time/step_s": s} for i, s in enumerate(step_s)]


def test_counted_step_is_the_last_saved_step_within_the_budget(report):
  records = _records([60.0] * 10)  # one minute a step
  assert report.counted_step(records, 0.0, [0, 2, 4, 6, 8, 10]) == 10  # no budget: the last saved step
  assert report.counted_step(records, 5.0, [0, 2, 4, 6, 8, 10]) == 4  # step 5 ends at 5 min, but is not saved
  assert report.counted_step(records, 5.5, list(range(11))) == 5
  assert report.counted_step(records, 0.5, [0, 2]) == 0  # nothing in budget: the step-0 policy
  with pytest.raises(ValueError, match="no saved checkpoint"):
    report.counted_step(records, 0.5, [2, 4])


def test_counted_checkpoint_rule_is_a_checked_config_field():
  c = default_config()
  assert validate_config(c).eval.counted_checkpoint == "last_within_budget"
  c.eval.counted_checkpoint = "best_on_test"
  with pytest.raises(ValueError, match="eval.counted_checkpoint"):
    validate_config(c)
  c = default_config()
  c.eval.budget_minutes = -1.0
  with pytest.raises(ValueError, match="eval.budget_minutes"):
    validate_config(c)


def test_table_rows_are_mean_and_std_over_seeds_from_the_reports(report, tmp_path):
  seeds = [
    {"seed": s, "test_before": {"success": 0.0, "rows": 8}, "test_after": {"success": a, "rows": 8}, "train_wall_s": 60}
    for s, a in enumerate([0.5, 1.0])
  ]
  for name, comparison in (("task_grpo", False), ("algos_task_ppo", True)):
    os.makedirs(tmp_path / name)
    with open(tmp_path / name / "report.json", "w") as f:
      json.dump({"name": name, "algo": "grpo", "steps": 4, "comparison": comparison, "machine": "m", "seeds": seeds}, f)
  report.render_table(str(tmp_path), str(tmp_path / "L.md"))
  text = (tmp_path / "L.md").read_text()
  seeds_part, algos_part = text.split("## Algorithms")
  assert (
    "| task_grpo (success) | grpo | 4 | 2 | 8 | 0.000 ± 0.000 | 0.750 ± 0.354 | 0.750 ± 0.354 | 0.00->0.50, 0.00->1.00 |"
    in seeds_part
  )
  assert "algos_task_ppo" in algos_part and "algos_task_ppo" not in seeds_part
  assert "not run" in algos_part  # the SmolLM2 goals are marked, not filled in


def test_shop_config_defaults_are_attempt_u_recipe():
  with open(os.path.join(ROOT, "experiments/results/smollm2_webshop/attempts/u_tokenmean_config.json")) as f:
    u = json.load(f)
  c = config_beside(os.path.join(ROOT, "configs", "x.py"), "smollm2_webshop_sft_grpo.py")
  for section, field in [
    ("loss", "agg"),
    ("train", "lr"),
    ("train", "skip_zero_adv_rows"),
    ("train", "skip_keeps_batch_mean"),
    ("rollout", "rows_per_step"),
    ("rollout", "num_chains"),
    ("rollout", "shared_turns"),
    ("sft", "tool_use_prob"),
    ("sft", "steps"),
    ("sft", "lr"),
  ]:
    assert c[section][field] == u[section][field], (section, field)
  assert c.train.steps == 6  # u's counted step (planned 8, stopped at 6: the chains drift to the turn cap after)
  assert c.eval.counted_checkpoint == "last_within_budget" and c.eval.budget_minutes > 0
  validate_config(c)
