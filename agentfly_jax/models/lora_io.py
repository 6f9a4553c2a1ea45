"""LoRA adapters <-> HF PEFT folders, and merged full HF folders.

    export_peft(model, "adapter/")        # adapter_config.json + adapter_model.safetensors
    load_peft("adapter/", model)          # adds the folder's adapters to a model without any
    save_merged(model, "merged/", tokenizer_dir=...)   # W + A B * scale, a plain HF folder

PEFT's layout (peft 0.21, LoraConfig): tensors `base_model.model.<module path>.lora_A.weight`
[r, in] and `...lora_B.weight` [out, r] (torch's [out, in] Linear layout, so ours transposed:
A [in, r] = lora_A.T, B [r, out] = lora_B.T), scale lora_alpha / r (rsLoRA: lora_alpha / sqrt(r)).
Our module paths are HF's (models/hf_io.py), so the module names carry over as they are.
"""

from __future__ import annotations

import json
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from agentfly_jax.models.lora import TARGET_NAMES, lora_candidates, merge_lora

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_TENSOR = re.compile(r"^base_model\.model\.(.+)\.lora_([AB])(?:\.default)?\.weight$")


def _adapted(model) -> list[tuple[str, object]]:
  return [(p, m) for p, m in lora_candidates(model) if m.lora_a is not None]


def peft_tensors(model) -> dict[str, np.ndarray]:
  """{PEFT tensor name: float32 array in PEFT's layout} of `model`'s adapters (a stacked
  layer's [L, ...] adapters are not supported here: unroll first)."""
  out = {}
  for path, m in _adapted(model):
    a, b = np.asarray(jax.device_get(m.lora_a[...])), np.asarray(jax.device_get(m.lora_b[...]))
    if a.ndim != 2:
      raise ValueError(f"export_peft: {path} has stacked adapters {a.shape}; PEFT files need the unrolled layout")
    out[f"base_model.model.{path}.lora_A.weight"] = np.ascontiguousarray(a.T.astype(np.float32))
    out[f"base_model.model.{path}.lora_B.weight"] = np.ascontiguousarray(b.T.astype(np.float32))
  return out


def write_peft_state(adapters, folder: str | os.PathLike, *, rank: int, alpha: float) -> int:
  """Writes an nnx.State of adapters (paths ending in lora_a / lora_b, unrolled layout; all of
  one `rank`, scale alpha / rank) as a PEFT folder; returns the tensors' bytes. For samplers
  that hold the adapters only (the state has no module to read the scale from)."""
  from flax import nnx

  tensors, modules = {}, set()
  for path, var in nnx.to_flat_state(adapters):
    module, leaf = ".".join(str(p) for p in path[:-1]), str(path[-1])
    value = np.asarray(jax.device_get(var[...] if isinstance(var, nnx.Variable) else var), np.float32)
    if leaf not in ("lora_a", "lora_b") or value.ndim != 2:
      raise ValueError(f"write_peft_state: {module}.{leaf} {value.shape} is not an unrolled LoRA adapter")
    tensors[f"base_model.model.{module}.lora_{leaf[-1].upper()}.weight"] = np.ascontiguousarray(value.T)
    modules.add(module.rsplit(".", 1)[-1])
  _write_folder(
    os.fspath(folder),
    tensors,
    rank=rank,
    alpha=float(alpha),
    target_modules=sorted(modules),
    base_model_name_or_path="",
  )
  return int(sum(t.nbytes for t in tensors.values()))


def _write_folder(
  folder: str, tensors: dict, *, rank: int, alpha: float, target_modules, base_model_name_or_path: str
) -> None:
  config = {
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "base_model_name_or_path": base_model_name_or_path or None,
    "r": int(rank),
    "lora_alpha": float(alpha),
    "target_modules": target_modules,
    "lora_dropout": 0.0,
    "bias": "none",
    "fan_in_fan_out": False,
    "use_rslora": False,
    "use_dora": False,
    "modules_to_save": None,
    "init_lora_weights": True,
    "inference_mode": True,
    "rank_pattern": {},
    "alpha_pattern": {},
    "layers_to_transform": None,
    "layers_pattern": None,
    "revision": None,
  }
  os.makedirs(folder, exist_ok=True)
  save_file(tensors, os.path.join(folder, WEIGHTS_FILE), metadata={"format": "pt"})
  with open(os.path.join(folder, CONFIG_FILE), "w") as f:
    json.dump(config, f, indent=2)


def _target_modules(model, paths: list[str]):
  """PEFT `target_modules`: module names when every decoder layer has the same set, else one
  regular expression that PEFT full-matches against module paths."""
  names = sorted({p.rsplit(".", 1)[-1] for p in paths})
  everywhere = [p for p, _ in lora_candidates(model) if p.rsplit(".", 1)[-1] in names]
  if sorted(everywhere) == sorted(paths):
    return names
  return "^(" + "|".join(re.escape(p) for p in sorted(paths)) + ")$"


def export_peft(model, folder: str | os.PathLike, *, base_model_name_or_path: str = "") -> str:
  """Writes `model`'s adapters as a PEFT folder (adapter_config.json + adapter_model.safetensors)
  that `peft.PeftModel.from_pretrained(hf_model, folder)` loads onto the HF model of the base.
  All adapters must share one rank and scale. Returns the folder."""
  adapted = _adapted(model)
  if not adapted:
    raise ValueError("export_peft: the model has no LoRA adapters (models.lora.apply_lora)")
  ranks = {m.lora_a.shape[-1] for _, m in adapted}
  scales = {m.lora_scale for _, m in adapted}
  if len(ranks) != 1 or len(scales) != 1:
    raise ValueError(
      f"export_peft: adapters of several ranks {sorted(ranks)} / scales {sorted(scales)}; PEFT's file needs one"
    )
  rank, scale = ranks.pop(), scales.pop()
  paths = [p for p, _ in adapted]
  folder = os.fspath(folder)
  _write_folder(
    folder,
    peft_tensors(model),
    rank=rank,
    alpha=float(scale * rank),
    target_modules=_target_modules(model, paths),
    base_model_name_or_path=base_model_name_or_path,
  )
  return folder


def _read_config(folder: str) -> dict:
  path = os.path.join(folder, CONFIG_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"load_peft: {path} not found (a PEFT LoRA folder has {CONFIG_FILE} + {WEIGHTS_FILE})")
  with open(path) as f:
    cfg = json.load(f)
  if cfg.get("peft_type") != "LORA":
    raise ValueError(f"{path}: peft_type {cfg.get('peft_type')!r} is not supported (only 'LORA')")
  unsupported = {
    "use_dora": False,
    "fan_in_fan_out": False,
    "bias": "none",
    "modules_to_save": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "layer_replication": None,
    "trainable_token_indices": None,
  }
  for field, ok in unsupported.items():
    value = cfg.get(field, ok)
    if value != ok and not (ok is None and value in ([], {})) and not (ok == {} and value is None):
      raise ValueError(f"{path}: {field}={value!r} is not supported (expected {ok!r})")
  if not (isinstance(cfg.get("r"), int) and cfg["r"] >= 1):
    raise ValueError(f"{path}: r must be an int >= 1, got {cfg.get('r')!r}")
  return cfg


def load_peft(folder: str | os.PathLike, model, *, seed: int = 0):
  """Adds the PEFT folder's LoRA adapters to `model` (which must have none), in place; returns
  `model`. Raises ValueError naming the file and field / tensor that does not fit."""
  folder = os.fspath(folder)
  cfg = _read_config(folder)
  rank = cfg["r"]
  alpha = float(cfg.get("lora_alpha", rank))
  # our Linear's scale is alpha / rank: rsLoRA's alpha / sqrt(r) as an equivalent alpha
  eff_alpha = alpha * math.sqrt(rank) if cfg.get("use_rslora") else alpha
  weights_path = os.path.join(folder, WEIGHTS_FILE)
  if not os.path.isfile(weights_path):
    raise FileNotFoundError(f"load_peft: {weights_path} not found")
  tensors = load_file(weights_path)
  modules = dict(lora_candidates(model))
  if any(m.lora_a is not None for m in modules.values()):
    raise ValueError("load_peft: the model already has LoRA adapters; load into a model without any")
  pairs: dict[str, dict[str, np.ndarray]] = {}
  for name, value in tensors.items():
    match = _TENSOR.match(name)
    if match is None:
      raise ValueError(
        f"{weights_path}: tensor {name!r} is not a LoRA A/B weight of a module "
        f"(expected base_model.model.<module>.lora_A.weight; supported modules: {sorted(TARGET_NAMES.values())})"
      )
    path, which = match.groups()
    if path not in modules:
      raise ValueError(
        f"{weights_path}: tensor {name!r}: the model has no projection {path!r} that can carry an adapter"
      )
    pairs.setdefault(path, {})[which] = value
  if not pairs:
    raise ValueError(f"{weights_path}: no LoRA tensors")
  key = jax.random.key(seed)
  for path, ab in sorted(pairs.items()):
    if set(ab) != {"A", "B"}:
      raise ValueError(f"{weights_path}: {path} has lora_{''.join(ab)} but not both A and B")
    m = modules[path]
    a, b = ab["A"].T, ab["B"].T  # [in, r], [r, out]
    if a.shape != (m.in_features, rank) or b.shape != (rank, m.out_features):
      raise ValueError(
        f"{weights_path}: {path}: lora_A {ab['A'].shape} / lora_B {ab['B'].shape} do not fit "
        f"a [{m.out_features}, {m.in_features}] projection at r={rank}"
      )
    key, sub = jax.random.split(key)
    m.add_lora(rank, eff_alpha, sub)
    m.lora_a[...] = jnp.asarray(a, jnp.float32)
    m.lora_b[...] = jnp.asarray(b, jnp.float32)
  return model


def save_merged(
  model, folder: str | os.PathLike, *, tokenizer_dir: str | os.PathLike | None = None, dtype: str | None = None
) -> str:
  """Writes `model` with its adapters folded into the kernels as a full HF folder
  (`hf_io.save_pretrained`); `model` is unchanged. Returns the folder."""
  from agentfly_jax.models.hf_io import save_pretrained

  return save_pretrained(merge_lora(model), folder, tokenizer_dir=tokenizer_dir, dtype=dtype)


__all__ = ["export_peft", "load_peft", "peft_tensors", "save_merged", "write_peft_state"]
