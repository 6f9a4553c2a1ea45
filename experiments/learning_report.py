"""Learning evidence: N seeds of a config end to end (SFT + RL), then the locked test split.

  .venv/bin/python experiments/learning_report.py --config=configs/lookup_grpo.py --seeds=3
  .venv/bin/python experiments/learning_report.py --config=configs/lookup_grpo.py --algos=grpo,rloo,reinforce_pp,ppo

Per seed: `Trainer(config).train()` (its eval during training reads the task's dev split only),
then the counted checkpoint is picked by the rule fixed before the run (the last saved step whose
cumulative step wall time is within the config's `eval.budget_minutes`, 0 = the last step), and
`evaluate_locked_test` scores it and the step-0 checkpoint (after the SFT warm start, before RL), greedily on the task's locked test split
(`make_test_rows`: read nowhere else). Nothing is selected on the test split: the counted step
comes from the config and the wall clock only. The training and each test evaluation run in a
child process of their own (`in_child`: memory goes back between phases); a finished training
(`trained.json` in the workdir) and each test score (`test_step<k>.json`) are kept for a run of the
same config, so a crash in a later phase re-runs only that phase.

Writes lab/results/learning/<name>/: seed<k>/metrics.jsonl, report.json (per-seed test
before -> after, counted step, wall, machine), dev_success.png (greedy dev success per step per
seed and their mean); then re-renders lab/results/LEARNING.md from every report.json.
`--algos=a,b,...`: one report per algorithm (`algos_<task>_<algo>`, or `algos_<x>_<algo>` for a
config named `algos_<x>_<config.algo>`; config.algo overridden), the algorithm-comparison table. Workdirs (checkpoints) go to runs/learning/<name>/ (git-ignored).
"""

import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFIG = config_flags.DEFINE_config_file("config", "configs/lookup_grpo.py", "ml_collections config file.")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Number of seeds (0, 1, ..., N-1 added to config.seed).")
_ALGOS = flags.DEFINE_list("algos", [], "Algorithm comparison: one report per algorithm (config.algo).")
_TEST_ROWS = flags.DEFINE_integer("test_rows", 64, "Rows of the locked test split.")
_OUT = flags.DEFINE_string("out", os.path.join(ROOT, "lab", "results", "learning"), "Results root.")
_RUNS = flags.DEFINE_string("runs", os.path.join(ROOT, "runs", "learning"), "Workdirs (checkpoints).")
_TABLE = flags.DEFINE_string("table", os.path.join(ROOT, "lab", "results", "LEARNING.md"), "Summary table.")
_NOTE = flags.DEFINE_string("note", "", "Machine note for the table (e.g. how busy it was).")
_METRIC = flags.DEFINE_enum("metric", "success", ["success", "reward"], "Table metric (reward: mean F1 for QA).")
_RESUME = flags.DEFINE_bool(
  "resume", True, "Keep a seed whose test.json was written by the same config (`same_run`); else re-run it."
)
_MAX_NEW_SEEDS = flags.DEFINE_integer(
  "max_new_seeds",
  0,
  "Run at most this many seeds not already done, then report the seeds done so far (0: all; -1: none, re-report only).",
)

TEST_SEED = 4242  # the locked test rows' seed: the same rows for every seed and every run


def counted_step(records: list[dict], budget_minutes: float, saved_steps: list[int]) -> int:
  """The counted checkpoint by the rule `last_within_budget`: the last saved step whose
  cumulative `time/step_s` is within the budget (0 = no budget: the last saved step)."""
  wall, within = 0.0, {0}
  for r in sorted((r for r in records if r.get("step", 0) > 0 and "time/step_s" in r), key=lambda r: r["step"]):
    wall += r["time/step_s"]
    if budget_minutes and wall > budget_minutes * 60:
      break
    within.add(r["step"])
  ok = [s for s in saved_steps if s in within]
  if not ok:
    raise ValueError(f"no saved checkpoint within {budget_minutes} min (saved: {saved_steps})")
  return max(ok)


def evaluate_locked_test(workdir: str, step: int, num_rows: int) -> dict:
  """Greedy success on the task's locked test split of the checkpoint `step` of `workdir` (the run
  rebuilt from its config.json, opened by rl/checkpoints.open_for_evaluation); the only reader of
  `make_test_rows` here."""
  from agentfly_jax.rl.checkpoints import open_for_evaluation
  from agentfly_jax.rl.run import rollout

  opened = open_for_evaluation(workdir, step)  # (its chains run at most a training step's at once: stages.rollout)
  rows = opened.run.parts.task.split_rows("test", num_rows, seed=TEST_SEED)
  trajs = rollout(opened.run, rows, num_chains=1, temperature=0.0, seed=TEST_SEED)
  return {"step": step, **locked_test_score(trajs, f"locked test of {workdir} step {step}")}


def locked_test_score(trajs: list, where: str) -> dict:
  """{"rows", "success", "reward"} of the greedy test chains; RuntimeError naming `where` when a chain
  failed (an env never acquired, a crash): a chain that never ran is not a failed goal, so no score is
  recorded and the phase runs again."""
  from agentfly_jax.rl.batching import rollout_metrics

  failed = [t for t in trajs if t.error is not None]
  if failed:
    raise RuntimeError(
      f"{where}: {len(failed)} of {len(trajs)} chains failed (first: group {failed[0].group_id}: "
      f"{failed[0].error}); no score recorded"
    )
  m = rollout_metrics(trajs, prefix="test")
  return {"rows": len(trajs), "success": m["test/success_rate"], "reward": m.get("test/reward_mean")}


def _saved_steps(workdir: str) -> list[int]:
  folder = os.path.join(workdir, "checkpoints")
  return sorted(int(d) for d in os.listdir(folder) if d.isdigit()) if os.path.isdir(folder) else []


def seed_config(config, seed: int):
  """The config a seed runs: `config` with `seed`, no progress bar, every checkpoint kept."""
  config = config.copy_and_resolve_references()
  config.seed = seed
  config.log.progress = False
  config.checkpoint.keep = max(config.checkpoint.keep, config.train.steps + 1)  # the counted step must survive
  return config


def config_hash(config, test_rows: int) -> str:
  """The hash of a seed's whole resolved config and the number of test rows (paths in the config
  count as written: a clone moved elsewhere re-runs seeds whose config holds its absolute path). The
  identity of records written before they held their config (`same_run`)."""
  text = json.dumps({"config": recipe(config), "test_rows": test_rows})
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def recipe(config) -> dict:
  """The resolved config as plain JSON values (what a seed's records hold as its identity)."""
  return json.loads(config.to_json_best_effort(sort_keys=True))


def identity(config, test_rows: int) -> dict:
  """What a seed's records (trained.json, test_step<k>.json, test.json) hold to say which run they are."""
  return {"config_hash": config_hash(config, test_rows), "test_rows": test_rows, "config": recipe(config)}


def same_run(data: dict | None, config, test_rows: int) -> bool:
  """Whether a record (`identity` + results) is of this seed config's run. A record holding its config:
  that config brought up to today's fields (rl/spec.migrate: an option added since gets the behaviour
  the run had, the option's default unless `_OLD_BEHAVIOUR` says otherwise) equals `config`, so adding
  an option does not invalidate every recorded seed. A record written before records held their config:
  by `config_hash`."""
  if data is None:
    return False
  if "config" not in data:
    return data.get("config_hash") == config_hash(config, test_rows)
  from agentfly_jax.rl.config import migrate

  return data.get("test_rows") == test_rows and recipe(migrate(data["config"])) == recipe(config)


def kept_seed(config, seed: int, out_dir: str, test_rows: int) -> dict | None:
  """The recorded result of `seed` in `out_dir` when it was run with this very config (None: not
  run, or run with another config: a changed recipe is never mixed into a report)."""
  result = _read_json(os.path.join(out_dir, "test.json"))
  return result if same_run(result, seed_config(config, seed), test_rows) else None


def in_child(fn, *args):
  """`fn(*args)` in a fresh spawned process: its memory goes back to the system when it ends. A
  seed's training and each test evaluation run in their own (the shop's RL needs up to ~18 GiB;
  its first test evaluation in the training's process was OOM-killed at 24 GiB)."""
  import concurrent.futures
  import multiprocessing

  with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
    return pool.submit(fn, *args).result()


def _train(config, workdir: str) -> float:
  """Wall seconds of `Trainer(config, workdir).train()` (run in a child; the records are in
  workdir/metrics.jsonl)."""
  logging.set_verbosity(logging.WARNING)
  from agentfly_jax.rl.scale.compile_cache import enable_compile_cache
  from agentfly_jax.rl.trainer import Trainer

  enable_compile_cache(config.train.compile_cache)
  t0 = time.time()
  Trainer(config, workdir).train()
  return time.time() - t0


def _evaluate(workdir: str, step: int, num_rows: int) -> dict:
  logging.set_verbosity(logging.WARNING)
  return evaluate_locked_test(workdir, step, num_rows)


def _read_json(path: str) -> dict | None:
  """The JSON object at `path` (None: absent)."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _write_json(path: str, data: dict) -> None:
  with open(path + ".tmp", "w") as f:
    json.dump(data, f, indent=2)
  os.replace(path + ".tmp", path)


def success_key(records: list[dict], prefix: str) -> str:
  """The metric of greedy / sampled success in `records`: the reward's own `<prefix>/reward_metric/success`
  where it was logged (metrics written before `success_rate` used it were reward > 0.5), else
  `<prefix>/success_rate`."""
  own = f"{prefix}/reward_metric/success"
  return own if any(own in r for r in records) else f"{prefix}/success_rate"


def run_seed(config, seed: int, workdir: str, out_dir: str, test_rows: int) -> dict:
  """Trains `seed` (unless `workdir` holds its finished training: `trained.json` with this config's
  config: `same_run`), then scores steps 0 and the counted step on the locked test split (each score kept
  in `workdir/test_step<k>.json`, so a crash loses only the phase it hit), each phase in a child process.
  Every record holds the seed's `identity` (its config)."""
  config = seed_config(config, seed)
  ident = identity(config, test_rows)
  marker = os.path.join(workdir, "trained.json")
  trained = _read_json(marker)
  if not same_run(trained, config, test_rows):
    shutil.rmtree(workdir, ignore_errors=True)
    train_wall = in_child(_train, config, workdir)
    trained = {**ident, "train_wall_s": train_wall}
    _write_json(marker, trained)
  else:
    print(f"seed {seed}: training kept ({marker}, same config)", flush=True)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  step = counted_step(records, config.eval.budget_minutes, _saved_steps(workdir))
  scores = {}
  for k in (0, step):
    path = os.path.join(workdir, f"test_step{k}.json")
    kept = _read_json(path)
    if not same_run(kept, config, test_rows):
      kept = {**ident, **in_child(_evaluate, workdir, k, test_rows)}
      _write_json(path, kept)
    scores[k] = {n: v for n, v in kept.items() if n not in ident}
  before, after = scores[0], scores[step]
  os.makedirs(out_dir, exist_ok=True)
  shutil.copy(os.path.join(workdir, "metrics.jsonl"), os.path.join(out_dir, "metrics.jsonl"))
  key_success = success_key(records, "eval")
  dev = [(r["step"], r[key_success]) for r in records if isinstance(r.get(key_success), (int, float))]
  dev_reward = [
    (r["step"], r["eval/reward_mean"]) for r in records if isinstance(r.get("eval/reward_mean"), (int, float))
  ]
  result = {
    "seed": seed,
    "config_hash": ident["config_hash"],
    "counted_step": step,
    "test_before": before,
    "test_after": after,
    "dev_greedy_success": dev,
    "dev_greedy_reward": dev_reward,
    "train_wall_s": trained["train_wall_s"],
    **({"train_wall_note": trained["note"]} if "note" in trained else {}),
    "test_rows": test_rows,
    "config": ident["config"],
  }
  _write_json(os.path.join(out_dir, "test.json"), result)
  print(
    f"seed {seed}: test {before['success']:.3f} -> {after['success']:.3f} (step {step}), {result['train_wall_s']:.0f} s",
    flush=True,
  )
  return result


def plot_dev(report: dict, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  metric = report.get("metric", "success")  # reward: the dev curve of the mean reward (F1 for QA)
  fig, ax = plt.subplots(figsize=(6, 3.5))
  curves = [dict(s[f"dev_greedy_{metric}"]) for s in report["seeds"]]
  for s, c in zip(report["seeds"], curves):
    ax.plot(list(c), list(c.values()), marker=".", alpha=0.5, label=f"seed {s['seed']}")
  common = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
  ax.plot(common, [statistics.mean(c[k] for c in curves) for k in common], color="k", lw=2, label="mean")
  ax.set_xlabel("RL step")
  ax.set_ylabel(f"greedy dev {metric}")
  ax.set_title(report["name"])
  ax.set_ylim(-0.05, 1.05)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def _mean_std(xs: list[float]) -> str:
  return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.3f}"


def early_sampled_success(out_root: str, r: dict, last_step: int = 10) -> str:
  """Mean (± std over seeds) of the sampled (T=1) rollout success (the mean reward for a
  `--metric=reward` report) over RL steps 1..last_step, read from each seed's metrics.jsonl: how
  fast a run learns where the final scores all saturate."""
  key = "rollout/reward_mean" if r.get("metric", "success") == "reward" else "rollout/success_rate"
  means = []
  for s in r["seeds"]:
    path = os.path.join(out_root, r["name"], f"seed{s['seed']}", "metrics.jsonl")
    if not os.path.exists(path):
      return "-"
    with open(path) as f:
      records = [json.loads(line) for line in f if line.strip()]
    k = success_key(records, "rollout") if key.endswith("success_rate") else key
    xs = [x[k] for x in records if 0 < x.get("step", 0) <= last_step and k in x]
    if not xs:
      return "-"
    means.append(statistics.mean(xs))
  return _mean_std(means)


def report_row(r: dict, out_root: str = "") -> str:
  seeds = r["seeds"]
  metric = r.get("metric", "success")
  before = [s["test_before"][metric] for s in seeds]
  after = [s["test_after"][metric] for s in seeds]
  delta = [a - b for a, b in zip(after, before)]
  per_seed = ", ".join(f"{b:.2f}->{a:.2f}" for b, a in zip(before, after))
  wall = statistics.mean(s["train_wall_s"] for s in seeds) / 60
  planned = r.get("seeds_planned", len(seeds))
  count = f"{len(seeds)}" if planned <= len(seeds) else f"{len(seeds)} of {planned}"
  return (
    f"| {r['name']} ({metric}) | {r['algo']} | {r['steps']} | {count} | {seeds[0]['test_after']['rows']} | "
    f"{_mean_std(before)} | {_mean_std(after)} | {_mean_std(delta)} | {per_seed} | "
    f"{early_sampled_success(out_root, r)} | {wall:.1f} | {r['machine']} |"
  )


_HEADER = (
  "| config | algo | RL steps | seeds | test rows | test before (step 0) | test after (counted step) | "
  "after - before | per seed | sampled success (reward rows: reward), RL steps 1-10 | min / seed | machine |\n"
  "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


@dataclasses.dataclass(frozen=True)
class Goal:
  """One of the issue's SmolLM2-135M-Instruct goals, judged from its report (`goal_status`)."""

  report: str  # the report's name (the config's name)
  metric: str  # "success" or "reward" (F1 for QA)
  target: float  # the mean change over the seeds on the locked test split must reach this
  every_seed_positive: bool
  text: str
  flags: str  # learning_report.py's flags that run it


GOALS = (
  Goal(
    "smollm2_multihop_2hop_sft_grpo",
    "reward",
    0.2,
    False,
    "multi-hop retrieval F1 +0.2, <= 90 min a seed",
    "--config=configs/smollm2_multihop_2hop_sft_grpo.py --seeds=3 --metric=reward",
  ),
  Goal(
    "smollm2_webshop_sft_grpo",
    "success",
    0.15,
    True,
    "shop success +0.15, every seed positive, <= 90 min a seed",
    "--config=configs/smollm2_webshop_sft_grpo.py --seeds=3",
  ),
)
GOAL_SEEDS = 3


def goal_status(report: dict | None, metric: str, goal: float, every_seed_positive: bool) -> str:
  """What a goal's report shows: not run, k of 3 seeds (open, or not met already: a seed not positive where
  every seed must be, or over 90 min), or met / not met with the numbers."""
  if report is None or not report["seeds"]:
    return "**not run**"
  seeds = report["seeds"]
  delta = [s["test_after"][metric] - s["test_before"][metric] for s in seeds]
  minutes = max(s["train_wall_s"] for s in seeds) / 60
  numbers = (
    f"test {metric} change {_mean_std(delta)} ({', '.join(f'{d:+.3f}' for d in delta)}), max {minutes:.0f} min a seed"
  )
  if len(seeds) < GOAL_SEEDS:
    failed = (every_seed_positive and min(delta) <= 0) or minutes > 90  # whatever the seeds still to run show
    state = "not met" if failed else "open"
    return f"**{len(seeds)} of {GOAL_SEEDS} seeds run** ({state}): {numbers}"
  met = statistics.mean(delta) >= goal and (not every_seed_positive or min(delta) > 0) and minutes <= 90
  return f"**{'met' if met else 'not met'}** over {len(seeds)} seeds: {numbers}"


def goals_section(reports: dict) -> str:
  rows = [
    f"| {g.text} | {goal_status(reports.get(g.report), g.metric, g.target, g.every_seed_positive)} | "
    f"`.venv/bin/python experiments/learning_report.py {g.flags}` |"
    for g in GOALS
  ]
  return "\n".join(
    [
      "## SmolLM2-135M-Instruct goals",
      "",
      "| goal (mean of 3 seeds, locked test split) | status | command (seeds already run with the same config are kept) |",
      "|---|---|---|",
      *rows,
      "",
      "A seed takes up to 90 min of a ~18 GiB job on this 2-core CPU, so the seeds are run a few at a time",
      "(`--max_new_seeds=1`); a seed is kept only while the config it ran is unchanged (`same_run`: its records",
      "hold its config, brought up to today's fields by spec.migrate).",
      "The earlier SmolLM2 numbers (lab/results/smollm2_multihop/, smollm2_webshop/) are single-seed,",
      "pre-split runs (their held-out rows shared entities / catalogue products with training, and the shop's",
      "counted attempt was chosen after looking at its held-out score): they are **not counted** here.",
      "",
    ]
  )


def _hand_note(out_root: str, name: str) -> str:
  path = os.path.join(out_root, name)
  if not os.path.exists(path):
    return ""
  with open(path) as f:
    return f.read().strip()


def render_table(out_root: str, table: str) -> None:
  reports = []
  for name in sorted(os.listdir(out_root)):
    path = os.path.join(out_root, name, "report.json")
    if os.path.exists(path):
      with open(path) as f:
        reports.append(json.load(f))
  main_rows = [report_row(r, out_root) for r in reports if not r.get("comparison")]
  seeds_note = _hand_note(out_root, "SEEDS_NOTE.md")  # hand-written: what the seeds rows show and do not
  algo_note = _hand_note(out_root, "ALGOS_NOTE.md")  # hand-written: what the comparison rows show
  algo_rows = [report_row(r, out_root) for r in reports if r.get("comparison")]
  text = [
    "# Learning evidence (experiments/learning_report.py)",
    "",
    "Greedy success (or mean reward, F1 for QA: the row says which) on each task's **locked test split** (rows only",
    "the final evaluation reads; dev rows drive the evals during training), before RL (step 0: after the SFT warm",
    "start) and at the counted checkpoint (the last saved within the config's `eval.budget_minutes`, fixed before the run).",
    "Mean ± std over seeds.",
    "'sampled success, RL steps 1-10': the T=1 rollouts' success (mean reward in a reward row) in the first 10",
    "steps (how fast a run learns).",
    "Wall times are from a 2-core CPU shared with other jobs: not comparable between rows.",
    "Rendered from lab/results/learning/*/report.json.",
    "",
    "## Seeds",
    "",
    _HEADER,
    *main_rows,
    "",
    *([seeds_note, ""] if seeds_note else []),
    "## Algorithms on one environment (after the AgentFly paper's comparison)",
    "",
    _HEADER,
    *algo_rows,
    "",
    *([algo_note, ""] if algo_note else []),
    goals_section({r["name"]: r for r in reports}),
  ]
  with open(table, "w") as f:
    f.write("\n".join(text))


def run_report(config, name: str, comparison: bool) -> None:
  out_dir = os.path.join(_OUT.value, name)
  seeds, new = [], 0
  for k in range(_SEEDS.value):
    seed = config.seed + k
    seed_dir = os.path.join(out_dir, f"seed{seed}")
    kept = kept_seed(config, seed, seed_dir, _TEST_ROWS.value) if _RESUME.value else None
    if kept is not None:
      print(f"seed {seed}: kept ({seed_dir}/test.json, same config)", flush=True)
      seeds.append(kept)
      continue
    if _MAX_NEW_SEEDS.value and new >= _MAX_NEW_SEEDS.value:
      break  # the seeds done so far are reported; a later run with the same flags goes on from here
    seeds.append(run_seed(config, seed, os.path.join(_RUNS.value, name, f"seed{seed}"), seed_dir, _TEST_ROWS.value))
    new += 1
  machine = f"{os.cpu_count()}-core CPU, no GPU, shared" + (f" ({_NOTE.value})" if _NOTE.value else "")
  report = {
    "name": name,
    "algo": config.algo,
    "steps": config.train.steps,
    "budget_minutes": config.eval.budget_minutes,
    "comparison": comparison,
    "metric": _METRIC.value,
    "machine": machine,
    "seeds_planned": _SEEDS.value,
    "wall_s": sum(s.get("total_wall_s", s["train_wall_s"]) for s in seeds),  # kept seeds included
    "seeds": seeds,
  }
  with open(os.path.join(out_dir, "report.json"), "w") as f:
    json.dump(report, f, indent=2)
  plot_dev(report, os.path.join(out_dir, "dev_success.png"))
  render_table(_OUT.value, _TABLE.value)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from agentfly_jax.rl.scale.compile_cache import enable_compile_cache

  config = _CONFIG.value
  enable_compile_cache(config.train.compile_cache)
  if not _ALGOS.value:
    run_report(config, config.name, comparison=False)
    return
  # a config named "algos_<x>_<algo>" (a comparison's own config) names its reports "algos_<x>_<algo>";
  # any other config "algos_<task>_<algo>"
  base = config.name.removesuffix(f"_{config.algo}")
  base = base if base.startswith("algos_") else f"algos_{config.task}"
  for algo in _ALGOS.value:
    c = config.copy_and_resolve_references()
    c.algo = algo
    c.name = f"{base}_{algo}"
    run_report(c, c.name, comparison=True)


if __name__ == "__main__":
  app.run(main)
