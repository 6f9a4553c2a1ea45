"""experiments/learning_report.py without training: the counted-checkpoint rule, the table, and the
shop config's defaults being the recipe that worked (attempt u's recorded config)."""

import json
import os

import numpy as np
import pytest
from train_cli import ROOT, load_script

from agentfly_jax.rl.config import config_beside, default_config, migrate, validate_config


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


def test_the_counted_checkpoint_budget_is_a_checked_config_field():
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
  (tmp_path / "SEEDS_NOTE.md").write_text("### What the seeds rows do not show\n")
  (tmp_path / "ALGOS_NOTE.md").write_text("### What the comparison shows\n")
  report.render_table(str(tmp_path), str(tmp_path / "L.md"))
  text = (tmp_path / "L.md").read_text()
  seeds_part, algos_part = text.split("## Algorithms")
  assert "What the seeds rows do not show" in seeds_part and "What the comparison shows" in algos_part
  assert (
    "| task_grpo (success) | grpo | 4 | 2 | 8 | 0.000 ± 0.000 | 0.750 ± 0.354 | 0.750 ± 0.354 | 0.00->0.50, 0.00->1.00 |"
    in seeds_part
  )
  assert "algos_task_ppo" in algos_part and "algos_task_ppo" not in seeds_part
  assert "not run" in algos_part  # the SmolLM2 goals are marked, not filled in
  assert "| task_grpo (success) | grpo | 4 | 2 |" in seeds_part  # no seeds_planned: the seeds run


def test_shop_config_defaults_are_attempt_u_recipe():
  with open(os.path.join(ROOT, "lab/results/smollm2_webshop/attempts/u_tokenmean_config.json")) as f:
    u = json.load(f)
  c = config_beside(os.path.join(ROOT, "configs", "x.py"), "smollm2_webshop_sft_grpo.py")
  # u skipped the tied groups' rows but kept them in the loss's mean: the plain update (spec.migrate drops the pair)
  assert (u["train"]["skip_zero_adv_rows"], u["train"]["skip_keeps_batch_mean"]) == (True, True)
  u = migrate(u).to_dict()
  for section, field in [
    ("loss", "agg"),
    ("train", "lr"),
    ("rollout", "rows_per_step"),
    ("rollout", "num_chains"),
    ("rollout", "shared_turns"),
    ("sft", "tool_use_prob"),
    ("sft", "steps"),
    ("sft", "lr"),
  ]:
    assert c[section][field] == u[section][field], (section, field)
  assert c.train.steps == 6  # u's counted step (planned 8, stopped at 6: the chains drift to the turn cap after)
  assert c.eval.budget_minutes > 0
  validate_config(c)


def _seed(seed, before, after, minutes=60):
  return {
    "seed": seed,
    "test_before": {"success": before, "reward": before, "rows": 8},
    "test_after": {"success": after, "reward": after, "rows": 8},
    "train_wall_s": minutes * 60,
  }


def test_goal_status_counts_seeds_and_applies_the_goal(report):
  assert report.goal_status(None, "success", 0.15, True) == "**not run**"
  one = report.goal_status({"seeds": [_seed(1, 0.1, 0.4)]}, "success", 0.15, True)
  assert one.startswith("**1 of 3 seeds run** (open)") and "+0.300" in one
  fell = report.goal_status({"seeds": [_seed(1, 0.8, 0.75)]}, "success", 0.15, True)
  assert fell.startswith("**1 of 3 seeds run** (not met)") and "-0.050" in fell  # every seed must rise: failed
  assert report.goal_status({"seeds": [_seed(1, 0.8, 0.75)]}, "success", 0.15, False).startswith(
    "**1 of 3 seeds run** (open)"
  )
  three = {"seeds": [_seed(1, 0.1, 0.4), _seed(2, 0.1, 0.3), _seed(3, 0.2, 0.3)]}
  assert report.goal_status(three, "success", 0.15, True).startswith("**met** over 3 seeds")
  assert report.goal_status(three, "success", 0.25, True).startswith("**not met**")  # mean +0.200
  one_negative = {"seeds": [_seed(1, 0.1, 0.9), _seed(2, 0.1, 0.5), _seed(3, 0.3, 0.2)]}
  assert report.goal_status(one_negative, "success", 0.15, True).startswith("**not met**")  # a seed fell
  assert report.goal_status(one_negative, "success", 0.15, False).startswith("**met**")
  slow = {"seeds": [_seed(1, 0.1, 0.4), _seed(2, 0.1, 0.4), _seed(3, 0.1, 0.4, minutes=95)]}
  assert report.goal_status(slow, "success", 0.15, True).startswith("**not met**")  # over 90 min a seed


def test_a_seed_is_kept_only_for_the_config_it_ran(report, tmp_path):
  c = default_config()
  c.seed = 7
  os.makedirs(tmp_path / "seed7")
  assert report.kept_seed(c, 7, str(tmp_path / "seed7"), 8) is None  # not run
  result = {"seed": 7, **report.identity(report.seed_config(c, 7), 8)}
  (tmp_path / "seed7" / "test.json").write_text(json.dumps(result))
  assert report.kept_seed(c, 7, str(tmp_path / "seed7"), 8) == result
  changed = c.copy_and_resolve_references()
  changed.train.lr = c.train.lr * 2
  assert report.kept_seed(changed, 7, str(tmp_path / "seed7"), 8) is None  # another recipe: run again
  assert report.kept_seed(c, 8, str(tmp_path / "seed7"), 8) is None  # another seed's config
  assert report.kept_seed(c, 7, str(tmp_path / "seed7"), 64) is None  # other test rows
  # a record written before an option existed: the same recipe while the option is at its default
  older = json.loads(json.dumps(result))
  del older["config"]["dapo"]["overlong_buffer"], older["config"]["loss"]["kl_coef"]
  (tmp_path / "seed7" / "test.json").write_text(json.dumps(older))
  assert report.kept_seed(c, 7, str(tmp_path / "seed7"), 8) == older
  with_option = c.copy_and_resolve_references()
  with_option.dapo.overlong_buffer = 8
  assert report.kept_seed(with_option, 7, str(tmp_path / "seed7"), 8) is None  # the new option in use
  gone = json.loads(json.dumps(result))
  gone["config"]["dapo"]["an_option_removed_since"] = 1
  (tmp_path / "seed7" / "test.json").write_text(json.dumps(gone))
  assert report.kept_seed(c, 7, str(tmp_path / "seed7"), 8) is None  # an option the current config lacks
  older["config"]["train"].pop("logits_capacity")  # before it existed runs took log-probs everywhere (spec.migrate)
  (tmp_path / "seed7" / "test.json").write_text(json.dumps(older))
  assert report.kept_seed(c, 7, str(tmp_path / "seed7"), 8) is None  # not today's default: another recipe
  old_way = c.copy_and_resolve_references()
  old_way.train.logits_capacity = ()
  assert report.kept_seed(old_way, 7, str(tmp_path / "seed7"), 8) == older
  # a record holding only its hash (written before records held their config)
  legacy = {"seed": 7, "config_hash": report.config_hash(report.seed_config(c, 7), 8)}
  (tmp_path / "seed7" / "test.json").write_text(json.dumps(legacy))
  assert report.kept_seed(c, 7, str(tmp_path / "seed7"), 8) == legacy
  assert report.kept_seed(changed, 7, str(tmp_path / "seed7"), 8) is None


def _finished_run(workdir, steps: int) -> None:
  for k in range(steps + 1):
    os.makedirs(workdir / "checkpoints" / str(k), exist_ok=True)
  (workdir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in _records([30.0] * steps)) + "\n")


def test_a_finished_training_and_each_test_score_are_kept_for_their_config(report, tmp_path, monkeypatch):
  c = default_config()
  c.seed, c.train.steps, c.eval.budget_minutes = 3, 2, 0.0
  workdir, out = tmp_path / "run", tmp_path / "out"
  _finished_run(workdir, 2)
  ident = report.identity(report.seed_config(c, 3), 8)
  (workdir / "trained.json").write_text(json.dumps({**ident, "train_wall_s": 61.0}))
  calls = []

  def child(fn, *args):  # the phases, recorded instead of run
    calls.append(fn.__name__)
    if fn.__name__ == "_train":
      _finished_run(workdir, 2)
      return 5.0
    _, step, rows = args
    return {"step": step, "rows": rows, "success": 0.5 if step else 0.25, "reward": None}

  monkeypatch.setattr(report, "in_child", child)
  result = report.run_seed(c, 3, str(workdir), str(out), 8)
  assert calls == ["_evaluate", "_evaluate"]  # trained already (same config): only the two test scores
  assert (result["counted_step"], result["train_wall_s"]) == (2, 61.0)
  assert (result["test_before"]["success"], result["test_after"]["success"]) == (0.25, 0.5)
  assert json.loads((out / "test.json").read_text()) == result
  calls.clear()
  assert report.run_seed(c, 3, str(workdir), str(out), 8) == result and calls == []  # both scores kept too
  changed = c.copy_and_resolve_references()
  changed.train.lr = c.train.lr * 2
  again = report.run_seed(changed, 3, str(workdir), str(out), 8)
  assert calls == ["_train", "_evaluate", "_evaluate"]  # another recipe: trained and scored afresh
  assert again["train_wall_s"] == 5.0 and again["config_hash"] != result["config_hash"]


def test_a_locked_test_with_a_failed_chain_records_no_score(report):
  """A chain that never ran (no env instance within the acquire timeout: the shop's first seed-1 scoring) is not a
  failed goal: the score is refused, naming the chain, so the phase runs again; without one the score is the chains'."""
  from agentfly_jax.agents.trajectory import Trajectory

  rng = np.random.default_rng(4)
  rewards = rng.random(6).round(3)
  trajs = [
    Trajectory(np.arange(5, dtype=np.int32), np.ones(5, bool), np.zeros(5, np.float32), reward=float(r), group_id=g)
    for g, r in enumerate(rewards)
  ]
  score = report.locked_test_score(trajs, "here")
  assert score["rows"] == 6 and score["success"] == pytest.approx(np.mean(rewards > 0.5))
  assert score["reward"] == pytest.approx(rewards.mean())
  trajs[3].error, trajs[3].reward = "EnvUnavailable: could not acquire 'webshop'", 0.0
  with pytest.raises(RuntimeError, match=r"here: 1 of 6 chains failed \(first: group 3: EnvUnavailable"):
    report.locked_test_score(trajs, "here")
