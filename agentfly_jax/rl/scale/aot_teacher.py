"""The `teacher` row of experiments/aot_compile.py: on-policy distillation's teacher forward (its log-probs of the
rollout batch's tokens: rl/core/prepare.make_teacher_logprobs, the program the trainer runs before prepare),
compiled for a topology at the teacher's own shapes beside the run's student.

    python experiments/aot_compile.py --config=configs/tpu/qwen25_7b_grpo.py --topology=v5p:2x2x2 \
        --model=qwen2.5-1.5b --config.teacher.pretrained=qwen2.5-7b --config.loss.distill_weight=1 \
        --programs=prepare,teacher

The teacher's shape: `teacher.pretrained` as a preset name (models/presets.py) or an HF folder / config.json; its
numerics the run's (`teacher.dtype` overriding the dtypes); sharded on the trainer's mesh by the run's rules.
"""

from __future__ import annotations

import json
import os

from agentfly_jax.rl.scale.aot_programs import (
  AbstractRun,
  abstract_model,
  abstract_step_arrays,
  compile_program,
  model_flops,
)


def teacher_config(spec):
  """(the teacher's ModelConfig, its name) of `spec.teacher.pretrained`; ValueError naming the field."""
  from agentfly_jax.models import ModelConfig
  from agentfly_jax.models.presets import PRESETS, preset_hf_config
  from agentfly_jax.rl.setup import model_numerics

  name = spec.teacher.pretrained
  if not name:
    raise ValueError("config.teacher.pretrained='': the teacher program needs a teacher (a preset or an HF folder)")
  if name.lower() in PRESETS:
    hf, source = preset_hf_config(name), f"preset {name}"
  else:
    path = os.path.join(name, "config.json") if os.path.isdir(name) else name
    if not os.path.isfile(path):
      raise ValueError(f"config.teacher.pretrained={name!r}: neither a preset ({sorted(PRESETS)}) nor an HF config")
    with open(path) as f:
      hf, source = json.load(f), path
  numerics = {**model_numerics(spec), "remat": False}  # forward only
  if spec.teacher.dtype:
    numerics.update(dtype=spec.teacher.dtype, param_dtype=spec.teacher.dtype)
  return ModelConfig.from_hf_dict(hf, source=source, **numerics), os.path.basename(name.rstrip("/"))


def compile_teacher(run: AbstractRun, chips: int) -> dict:
  """The `teacher` row: the teacher's log-probs of the rollout batch (the shapes `prepare` takes), its params
  on the trainer's mesh."""
  from agentfly_jax.models import CausalLM
  from agentfly_jax.rl.core.prepare import make_teacher_logprobs
  from agentfly_jax.rl.update import prepare_config

  cfg, name = teacher_config(run.spec)
  graphdef, params, rest, _ = abstract_model(CausalLM, cfg, run.mesh, run.rules)
  prep_cfg = prepare_config(run.spec, run.loss_cfg, run.spec.algorithm.estimator, run.update.prepare_chunk)
  n_rows, arrays = abstract_step_arrays(run)
  row = compile_program(
    "teacher", make_teacher_logprobs(graphdef, prep_cfg, mesh=run.mesh, rules=run.rules), params, rest, arrays
  )
  row["micro_batch"] = f"teacher {name}: {n_rows}x{run.seq_len}, chunks of {run.update.prepare_chunk} rows"
  row["model_flops"] = (
    model_flops(cfg, n_rows * run.seq_len, run.seq_len, backward=False, remat=False, critic=False) / chips
  )
  return row


COMPILERS = {"teacher": compile_teacher}
