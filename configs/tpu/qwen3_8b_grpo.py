"""Qwen3-8B GRPO on the TPU topology `v6e:2x4` (8 chips of 32 GiB; Cloud's v6e-8), JAX sampler and
trainer on one fsdp=8 mesh, rows of 2,048 tokens: configs/tpu/qwen25_7b_grpo.py with this model.

  python experiments/train.py --config=configs/tpu/qwen3_8b_grpo.py:/ckpt/Qwen3-8B --workdir=... --coordinator_address=auto
  python experiments/aot_compile.py --config=configs/tpu/qwen3_8b_grpo.py --topology=v6e:2x4   # compile-only

experiments/results/aot_tpu.md has what XLA reports for its train step on v6e:2x4.
"""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location("qwen25_7b_grpo", os.path.join(os.path.dirname(__file__), "qwen25_7b_grpo.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def get_config(model_dir: str = ""):
  """`model_dir`: an HF folder (the text after `configs/tpu/qwen3_8b_grpo.py:`)."""
  c = _base.get_config(model_dir)
  c.name = "qwen3_8b_grpo_v6e8"
  c.model.aot_preset = "qwen3-8b"
  return c
