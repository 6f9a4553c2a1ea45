"""How strong an SFT warm start to give before RL: one SFT run of a config, greedy-evaluated at
several step counts on validation rows (training-split rows of their own seed, never the
held-out eval rows, so choosing the step count does not look at the test), each step count's
params written to the config's `sft.cache_dir` under the key a run with `sft.steps=K` reads.

  .venv/bin/python experiments/sft_probe.py --config=configs/smollm2_webshop_sft_grpo.py \
      --at=16,24,32 --out=runs/sft_probe_webshop.json

Then `experiments/train.py --config=... --config.sft.steps=K` starts RL from the cached params of
step count K (the SFT lr is constant and step i's demos depend on i only, so the params after K
steps of a longer SFT are those of a K-step SFT). Writes a JSON of the per-step NLL, the step
time and each evaluation (reward, success and the task's reward parts).
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config (configs/*.py).", lock_config=False)
_AT = flags.DEFINE_list("at", ["16", "24", "32"], "SFT step counts to evaluate and cache.")
_VAL_ROWS = flags.DEFINE_integer("val_rows", 24, "Validation rows (training split, their own seed).")
_VAL_SEED = flags.DEFINE_integer("val_seed", 424_242, "Seed of the validation rows (not an SFT or RL row seed).")
_OUT = flags.DEFINE_string("out", "runs/sft_probe.json", "JSON of the probe's measurements.")


def main(argv):
  del argv
  from agentfly_jax.rl.scale.compile_cache import enable_compile_cache
  from agentfly_jax.rl.evaluation import evaluate
  from agentfly_jax.rl.run import open_run
  from agentfly_jax.rl.sft_cache import run_sft, save_sft_cache
  from agentfly_jax.rl.spec import RunSpec
  from agentfly_jax.tasks.from_config import absolutize_paths, build_task

  config = _CONFIG.value
  at = sorted({int(k) for k in _AT.value})
  if not at or at[0] < 1:
    raise app.UsageError(f"--at needs positive step counts, got {_AT.value}")
  absolutize_paths(config)
  spec = RunSpec.from_config(config)
  if not spec.sft.cache_dir:
    raise app.UsageError("the config has no sft.cache_dir: the probe's params would be lost")
  task = build_task(spec)
  enable_compile_cache(spec.train.compile_cache)
  workdir = tempfile.TemporaryDirectory(prefix="sft_probe_")  # the trainer's run folder: unused here
  run = open_run(spec, workdir.name, task=task)
  val_rows = run.parts.task.make_rows(_VAL_ROWS.value, seed=_VAL_SEED.value)
  record = {"config": config.to_dict(), "at": at, "val_seed": _VAL_SEED.value, "evals": [], "step_s": []}
  t_last = time.perf_counter()

  def after_step(done: int, params) -> None:
    nonlocal t_last
    import jax

    jax.block_until_ready(params)  # true step times (JAX dispatches ahead of the computation)
    record["step_s"].append(time.perf_counter() - t_last)
    if done in at:
      path = save_sft_cache(run, params, steps=done)
      t_eval = time.perf_counter()
      metrics = evaluate(run, params, rows=val_rows, seed=spec.seed)
      entry = {"sft_steps": done, "eval_s": time.perf_counter() - t_eval, "cache": path, **metrics}
      record["evals"].append(entry)
      print(json.dumps({k: v for k, v in entry.items() if not isinstance(v, (list, dict))}), flush=True)
      _write(record)
    t_last = time.perf_counter()

  _, nll = run_sft(run, steps=at[-1], after_step=after_step)
  record["nll"] = nll
  _write(record)
  print(f"wrote {_OUT.value}")
  workdir.cleanup()


def _write(record: dict) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(record, f, indent=1, default=float)


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  app.run(main)
