"""The training config as the user writes it: `default_config()`, presets, and `migrate()` for
configs saved by older versions.

Config files in `configs/` call `default_config()` (or a preset) and override; absl flags override
those (`--config.train.lr=1e-4`). The run parses it once into typed sections (`rl/spec.RunSpec`),
which stops a run before training with a message naming the bad field.
"""

from __future__ import annotations

import ml_collections

from agentfly_jax.rl.spec import ALGORITHMS, RunSpec, migrate  # noqa: F401 (re-exported)


def config_beside(config_file: str, name: str) -> ml_collections.ConfigDict:
  """`get_config()` of the config file `name` in the folder of `config_file` (a config building on
  another: configs/ is not a package). `config_beside(__file__, "smollm2_arithmetic_lora.py")`."""
  import importlib.util
  import os

  path = os.path.join(os.path.dirname(os.path.abspath(config_file)), name)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config_beside: no config file {path}")
  spec = importlib.util.spec_from_file_location(os.path.splitext(name)[0], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def default_config() -> ml_collections.ConfigDict:
  """Every field at its default (the defaults live in rl/spec.py's sections, once)."""
  return ml_collections.ConfigDict(RunSpec().to_dict())


def validate_config(c, *, custom_task: bool = False) -> RunSpec:
  """Raises ValueError naming the first bad field (runs before any model or rollout); returns the
  typed run (`RunSpec.from_config`)."""
  return RunSpec.from_config(c, custom_task=custom_task)


def lookup_config(algo: str, warmstart_dir: str) -> ml_collections.ConfigDict:
  """The lookup demo task with `algo`, starting from the shipped warm start (an HF folder built by
  experiments/make_warmstart.py) instead of an SFT phase."""
  c = default_config()
  c.name = f"lookup_{algo}"
  c.task = "lookup"
  c.algo = algo
  c.model.pretrained = warmstart_dir
  c.sft.steps = 0
  c.train.steps = 40
  c.train.lr = 5e-4
  return c


def task_config(task: str, algo: str, **overrides) -> ml_collections.ConfigDict:
  """A built-in task (agentfly_jax.tasks) with `algo`, a random-init tiny policy (its tokenizer
  trained on the task's texts) and rollout limits sized for multi-turn tool use; `overrides`
  are "section.key" -> value."""
  c = default_config()
  c.name = f"{task}_{algo}"
  c.task = task
  c.algo = algo
  c.model.vocab_size = 1024
  c.rollout.max_turns = 4
  c.rollout.max_tokens_per_turn = 48
  c.rollout.max_total_tokens = 1024
  for field, value in overrides.items():
    section, _, key = field.rpartition(".")
    (c[section] if section else c)[key] = value
  return c


def world_config(task: str, algo: str = "grpo") -> ml_collections.ConfigDict:
  """An interactive-world task (webshop / textworld / scienceworld) with `algo`: a tiny random-init
  policy (its tokenizer trained on the task's texts) and small rollouts, sized for a CPU smoke
  run; on a GPU set model.pretrained and raise rollout/train sizes with flags."""
  return task_config(
    task,
    algo,
    **{
      "rollout.rows_per_step": 4,
      "rollout.num_chains": 4,
      "rollout.max_turns": 8,
      "rollout.max_tokens_per_turn": 48,
      "rollout.max_total_tokens": 1536,
      "train.steps": 100,
      "train.lr": 3e-4,
      "eval.every": 0,
      "eval.num_rows": 16,
    },
  )


def tpu_grpo_config(
  name: str, aot_preset: str, model_dir: str = "", *, fsdp: int, max_total_tokens: int = 2048, micro_batch_size: int = 8
) -> ml_collections.ConfigDict:
  """GRPO on the arithmetic tool task at a real size on a TPU slice (configs/tpu/): bfloat16 compute
  over float32 master params, remat "full", scanned layers, the Pallas attention kernel, the JAX
  sampler and the trainer on one (fsdp, 1) mesh. `aot_preset`: experiments/aot_compile.py's model
  shape when `model_dir` (an HF folder) is empty."""
  c = default_config()
  c.name = name
  c.task = "arithmetic"
  c.algo = "grpo"
  c.model.pretrained = model_dir
  c.model.aot_preset = aot_preset
  c.model.dtype = "bfloat16"
  c.model.param_dtype = "float32"
  c.model.scan_layers = True
  c.model.attention_chunk = 512  # unused by "pallas"; read when attention_impl is set back to "flash" (GPU rows)
  c.model.attention_impl = "pallas"  # the TPU kernel: no [T, T] scores in HBM, one custom call to compile
  c.train.remat = "full"
  c.mesh.fsdp, c.mesh.tp = fsdp, 1
  c.rollout.sampler = "jax"
  c.rollout.rows_per_step = 8
  c.rollout.num_chains = 8
  c.rollout.max_turns = 2
  c.rollout.max_tokens_per_turn = 256
  c.rollout.max_total_tokens = max_total_tokens
  c.rollout.max_batch_size = 64
  c.train.steps = 200
  c.train.lr = 1e-6
  c.train.micro_batch_size = micro_batch_size
  c.train.logits_chunk = 256
  # one compact size for the log-probs (2 turns x 256 tokens written of 2,048 fit a quarter) and the
  # full fallback: each size is a branch compiled forward and backward (3 sizes: ~20 s more compile at 7B)
  c.train.logits_capacity = (0.25,)
  c.loss.kl_coef = 0.0
  c.eval.every = 20
  c.eval.num_rows = 64
  c.checkpoint.every = 20
  c.checkpoint.keep = 2
  return c


def tpu_vl_grpo_config(name: str, aot_preset: str, model_dir: str = "", *, fsdp: int) -> ml_collections.ConfigDict:
  """`tpu_grpo_config` for a Qwen2.5-VL policy on images (the `visual_qa` task), the vision tower frozen
  (`model.vision.train=True` trains it too); 5 turns: a GUI task's chain takes a screenshot a turn, so the AOT
  tool's rows carry 5 screenshots a row (experiments/aot_compile.py --images)."""
  c = tpu_grpo_config(name, aot_preset, model_dir, fsdp=fsdp)
  c.task = "visual_qa"
  c.model.family = "qwen2_5_vl"
  c.rollout.max_turns = 5
  return c
