"""HF checkpoint folders <-> NNX models: the one name/transpose table, streaming load, save.

    model = from_pretrained("path/to/hf_folder")          # CausalLM, config in model.config
    critic = from_pretrained(folder, critic=True)          # trunk from the folder, head fresh or loaded
    save_pretrained(model, out_dir, tokenizer_dir=folder)  # config.json + *.safetensors (+ tokenizer)
    tensors = to_hf_state_dict(model)                      # {hf_name: np.ndarray in HF layout}

The HF layout: Linear weights are [out, in] (ours: kernel [in, out], so transposed), the
embedding is [V, D] in both, norms are `.weight` (ours: `.scale`). A transposed kernel of more
dims (the vision patch embedding's [C, T, P, P, D], HF's Conv3d weight [D, C, T, P, P]) has its
output dim moved first (`to_hf_layout`). A qwen2_5_vl folder loads as models/qwen25_vl.py's Qwen25VL. `hf_name(path)` maps a
parameter path of our module tree to its HF name and whether it is transposed. A scanned model's
stacked params ([L, ...], `scan_layers`) are read and written as their L per-layer HF tensors.
A mixture-of-experts layer's expert kernels (mlp.experts.gate_proj.kernel [E, in, out],
models/moe.py) are read and written as HF checkpoints store them, E tensors
mlp.experts.<e>.gate_proj.weight [out, in] (`per_expert`); the router is mlp.gate.weight [E, D].
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from agentfly_jax.models.causal_lm import Critic
from agentfly_jax.models.config import ModelConfig
from agentfly_jax.models.layer_stack import is_stacked_path, per_layer
from agentfly_jax.models.qwen25_vl import model_class

log = logging.getLogger(__name__)

# Last path component of our parameter -> (HF suffix, transposed?).
_LEAF_TABLE = {
  "kernel": ("weight", True),
  "embedding": ("weight", False),
  "scale": ("weight", False),
  "bias": ("bias", False),
}
TOKENIZER_FILES = (
  "tokenizer.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "vocab.json",
  "merges.txt",
  "added_tokens.json",
  "tokenizer.model",
  "chat_template.jinja",
  "chat_template.json",
  "generation_config.json",
)
SAFE_METADATA = {"format": "pt"}


def hf_name(path: tuple) -> tuple[str, bool]:
  """Our param path, e.g. ('model', 'layers', 0, 'self_attn', 'q_proj', 'kernel') ->
  ('model.layers.0.self_attn.q_proj.weight', True): the HF tensor name and whether the HF
  tensor is the transpose of ours."""
  *prefix, leaf = [str(p) for p in path]
  if leaf not in _LEAF_TABLE:
    raise KeyError(f"no HF name for parameter path {'/'.join(map(str, path))}")
  suffix, transposed = _LEAF_TABLE[leaf]
  return ".".join(prefix + [suffix]), transposed


def to_hf_layout(array: np.ndarray, transposed: bool) -> np.ndarray:
  """Our array in HF's layout: a transposed one with its last (output) dim moved first (2-D: `.T`)."""
  return np.ascontiguousarray(np.moveaxis(array, -1, 0)) if transposed else array


def from_hf_layout(array: np.ndarray, transposed: bool) -> np.ndarray:
  """The inverse of `to_hf_layout`."""
  return np.moveaxis(array, 0, -1) if transposed else array


def is_expert_path(path: tuple) -> bool:
  """True for an expert kernel path (..., 'experts', <proj>, 'kernel' | 'lora_a' | 'lora_b'), no expert index."""
  keys = [str(p) for p in path]
  return len(keys) >= 3 and keys[-3] == "experts"


def per_expert(path: tuple, value) -> Iterator[tuple[tuple, Any]]:
  """(path, value) as it is, or for an expert kernel [E, ...] one (path with the expert index
  after 'experts', value[e]) per expert: the names HF checkpoints use."""
  if not is_expert_path(path):
    yield path, value
    return
  j = len(path) - 2
  for e in range(value.shape[0]):
    yield path[:j] + (e,) + path[j:], value[e]


def _params_flat(model_or_state) -> list[tuple[tuple, Any]]:
  """(path, value) per param in the unrolled, per-expert layout (a stacked param gives one per
  layer, an expert kernel one per expert)."""
  return [
    item
    for path, value in _params_flat_as_stored(model_or_state)
    for layer_item in per_layer(path, value)
    for item in per_expert(*layer_item)
  ]


def _params_flat_as_stored(model_or_state) -> list[tuple[tuple, Any]]:
  if isinstance(model_or_state, nnx.Module):
    state = nnx.state(model_or_state, nnx.Param)
  else:
    state = model_or_state
  if isinstance(state, nnx.State):
    return [(path, var[...] if isinstance(var, nnx.Variable) else var) for path, var in nnx.to_flat_state(state)]
  if isinstance(state, dict):  # nested dict of arrays (e.g. nnx.State.to_pure_dict())
    return [(tuple(k for k in path), leaf) for path, leaf in _flatten_dict(state)]
  raise TypeError(f"expected an nnx model, nnx.State or nested dict of params, got {type(model_or_state).__name__}")


def _flatten_dict(d: dict, prefix: tuple = ()) -> Iterator[tuple[tuple, Any]]:
  for k, v in d.items():
    if isinstance(v, dict):
      yield from _flatten_dict(v, prefix + (k,))
    else:
      yield prefix + (k,), v


def iter_hf_tensors(model_or_state) -> Iterator[tuple[str, np.ndarray]]:
  """Yields (hf_name, numpy array in HF layout), one parameter at a time (host copy per tensor)."""
  for path, value in _params_flat(model_or_state):
    name, transposed = hf_name(path)
    array = np.asarray(jax.device_get(value))
    yield name, to_hf_layout(array, transposed)


def to_hf_state_dict(model_or_state, cfg: ModelConfig | None = None) -> dict[str, np.ndarray]:
  """{hf_name: np.ndarray} in HF layout for a CausalLM / Critic, its nnx.State, or a nested dict
  of param arrays. Tied models have no `lm_head.weight` (as HF saves them). `cfg` is accepted
  for symmetry and used only to check the tensor count when given."""
  tensors = dict(iter_hf_tensors(model_or_state))
  if (
    cfg is not None
    and not cfg.tie_word_embeddings
    and "lm_head.weight" not in tensors
    and "score.weight" not in tensors
  ):
    raise ValueError("to_hf_state_dict: config has untied embeddings but the state has no lm_head")
  return tensors


# ---- loading ------------------------------------------------------------------------------

_SAFE_DTYPES = {
  "F64": np.float64,
  "F32": np.float32,
  "F16": np.float16,
  "BF16": jnp.bfloat16,
  "I64": np.int64,
  "I32": np.int32,
  "I16": np.int16,
  "I8": np.int8,
  "U8": np.uint8,
  "BOOL": np.bool_,
}


class SafetensorsFile:
  """Reads single tensors from a .safetensors file with plain file reads (no mmap), so only the
  tensor being read occupies host memory, not the mapped file."""

  def __init__(self, path: str):
    self.path = path
    self._f = open(path, "rb")
    try:
      (n,) = np.frombuffer(self._f.read(8), "<u8")
      self.header = json.loads(self._f.read(int(n)))
    except Exception as e:
      self._f.close()
      raise ValueError(f"{path}: not a valid safetensors file ({e})") from e
    self.header.pop("__metadata__", None)
    self._data_start = 8 + int(n)

  def keys(self):
    return self.header.keys()

  def shape(self, name: str) -> tuple:
    return tuple(self.header[name]["shape"])

  def get_tensor(self, name: str) -> np.ndarray:
    info = self.header[name]
    if info["dtype"] not in _SAFE_DTYPES:
      raise ValueError(f"{self.path}: tensor {name!r} has unsupported dtype {info['dtype']}")
    begin, end = info["data_offsets"]
    array = np.empty(info["shape"], _SAFE_DTYPES[info["dtype"]])
    buf = memoryview(array.reshape(-1).view(np.uint8))
    if buf.nbytes != end - begin:
      raise ValueError(
        f"{self.path}: tensor {name!r} byte size {end - begin} does not match {info['dtype']}{info['shape']}"
      )
    self._f.seek(self._data_start + begin)
    if self._f.readinto(buf) != buf.nbytes:
      raise ValueError(f"{self.path}: truncated data for tensor {name!r}")
    return array

  def close(self):
    self._f.close()


def _read_config(folder: str) -> dict:
  if not os.path.isdir(folder):
    raise FileNotFoundError(f"checkpoint folder {folder!r} does not exist")
  path = os.path.join(folder, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: missing config.json in checkpoint folder {folder!r}")
  try:
    with open(path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: not valid JSON ({e})") from e


def _tensor_files(folder: str) -> dict[str, str]:
  """{hf_tensor_name: safetensors file path} from the index file or the single-file layout."""
  index_path = os.path.join(folder, "model.safetensors.index.json")
  if os.path.isfile(index_path):
    with open(index_path) as f:
      weight_map = json.load(f).get("weight_map")
    if not isinstance(weight_map, dict):
      raise ValueError(f"{index_path}: no 'weight_map' object")
    files = {name: os.path.join(folder, fname) for name, fname in weight_map.items()}
    for fpath in sorted(set(files.values())):
      if not os.path.isfile(fpath):
        raise FileNotFoundError(f"{fpath}: listed in {index_path} but missing")
    return files
  single = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
  if not single:
    raise FileNotFoundError(
      f"{folder}: no model.safetensors (or model.safetensors.index.json) found; "
      f"files present: {sorted(os.listdir(folder))}"
    )
  files = {}
  for fname in single:
    fpath = os.path.join(folder, fname)
    reader = SafetensorsFile(fpath)
    for name in reader.keys():
      files[name] = fpath
    reader.close()
  return files


def from_pretrained(
  folder: str | os.PathLike,
  dtype: str | None = None,
  *,
  param_dtype: str | None = None,
  critic: bool = False,
  mesh: jax.sharding.Mesh | None = None,
  seed: int = 0,
  sharding_rules=None,
  **config_overrides,
):
  """Loads an HF checkpoint folder (Qwen2/2.5, Qwen3, Llama) into a CausalLM (or a Critic); a
  Qwen2.5-VL folder into a Qwen25VL (no critic).

  Tensors are streamed one at a time from the safetensors files into the parameters, so peak
  host memory is about one copy of the weights. The tokenizer files stay in `folder`.

  Args:
    folder: HF folder with config.json and model.safetensors or model.safetensors.index.json.
    dtype: compute dtype ('float32' default, 'bfloat16'); also the param dtype unless
      `param_dtype` is given.
    param_dtype: parameter dtype.
    critic: build a Critic: trunk from the folder, value head `score.*` from the folder when
      present (an HF *ForTokenClassification checkpoint), else freshly initialised from `seed`.
    mesh: place each parameter with its partition spec (`partition_specs`) as it is loaded.
    sharding_rules: logical axis name -> mesh axes (default models.sharding.DEFAULT_RULES).
    **config_overrides: ModelConfig fields, e.g. remat=True.

  Returns:
    the model; its ModelConfig is `model.config`.

  Raises:
    FileNotFoundError naming the missing file; ValueError naming the tensor whose shape is
    wrong or that is missing, or the config field that is unsupported.
  """
  folder = os.fspath(folder)
  hf = _read_config(folder)
  overrides = dict(config_overrides)
  if dtype is not None:
    overrides["dtype"] = dtype
    overrides.setdefault("param_dtype", dtype)
  if param_dtype is not None:
    overrides["param_dtype"] = param_dtype
  cfg = ModelConfig.from_hf_dict(hf, source=os.path.join(folder, "config.json"), **overrides)
  if cfg.vision is not None and critic:
    raise ValueError(
      f"{folder}: critic=True is not supported for model_type {cfg.model_type!r} (a vision-language model)"
    )
  cls = model_class(cfg, critic=critic)
  files_early = _tensor_files(folder)
  if cfg.is_moe:
    _check_expert_count(cfg, files_early, folder)
  abstract = nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(seed)))
  graphdef, state = nnx.split(abstract)
  flat = nnx.to_flat_state(state)
  files = files_early
  head_init = None
  specs = None
  if mesh is not None:
    from agentfly_jax.models.sharding import partition_spec_of

    specs = partition_spec_of
  handles = {}
  used = set()

  def read(path, expected, dtype):
    """Parameter `path`'s (unrolled layout) array of shape `expected` from the checkpoint."""
    nonlocal head_init
    name, transposed = hf_name(path)
    if name not in files and critic and name.startswith("score."):
      if head_init is None:
        head = nnx.Linear(
          cfg.hidden_size,
          1,
          rngs=nnx.Rngs(seed),
          param_dtype=cfg.params_dtype,
          kernel_init=nnx.initializers.normal(cfg.initializer_range),
        )
        head_init = {"score.weight": np.asarray(head.kernel[...]).T, "score.bias": np.asarray(head.bias[...])}
      array = head_init[name]
    else:
      if name not in files:
        raise ValueError(
          f"{folder}: checkpoint is missing tensor {name!r} (needed for parameter {'/'.join(map(str, path))})"
        )
      fpath = files[name]
      if fpath not in handles:
        handles[fpath] = SafetensorsFile(fpath)
      array = handles[fpath].get_tensor(name)
      used.add(name)
    hf_shape = (expected[-1],) + tuple(expected[:-1]) if transposed else expected
    if tuple(array.shape) != hf_shape:
      raise ValueError(
        f"{files.get(name, folder)}: tensor {name!r} has shape {tuple(array.shape)}, "
        f"expected {hf_shape} for config {os.path.join(folder, 'config.json')}"
      )
    return np.asarray(from_hf_layout(array, transposed), dtype=dtype)

  def read_layer(path, shape, dtype):
    """An unrolled param: an expert kernel [E, ...] from its E per-expert tensors."""
    if is_expert_path(path):
      return np.stack([read(p, tuple(shape[1:]), dtype) for p, _ in per_expert(path, np.empty(shape[:1]))])
    return read(path, tuple(shape), dtype)

  try:
    for path, var in flat:
      if is_stacked_path(path):  # scanned layers: the L per-layer tensors, stacked
        array = np.stack(
          [read_layer(p, tuple(var.shape[1:]), var.dtype) for p, _ in per_layer(path, np.empty(var.shape[:1]))]
        )
      else:
        array = read_layer(path, tuple(var.shape), var.dtype)
      if specs is not None:
        sharding = jax.sharding.NamedSharding(mesh, specs(path, var, sharding_rules, mesh))
        value = jax.device_put(array, sharding)
      else:
        value = jnp.asarray(array)
      del array
      var.set_value(value)
  finally:
    for h in handles.values():
      h.close()
  unused = sorted(set(files) - used - {"lm_head.weight"})
  if unused:
    log.warning("from_pretrained(%s): ignored %d checkpoint tensors, e.g. %s", folder, len(unused), unused[:5])
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _check_expert_count(cfg: ModelConfig, files: dict, folder: str) -> None:
  """ValueError naming num_experts when the checkpoint's expert tensors / router rows do not
  match the config's count."""
  import re

  config_path = os.path.join(folder, "config.json")
  layer = cfg.moe_layers[0]
  pattern = re.compile(rf"^model\.layers\.{layer}\.mlp\.experts\.(\d+)\.gate_proj\.weight$")
  found = {int(m.group(1)) for name in files for m in [pattern.match(name)] if m}
  if "model.layers.%d.mlp.experts.gate_up_proj" % layer in files:
    raise ValueError(
      f"{folder}: expert weights are stored fused (mlp.experts.gate_up_proj); expected the per-expert "
      "tensors mlp.experts.<e>.gate_proj.weight HF checkpoints hold"
    )
  gate = f"model.layers.{layer}.mlp.gate.weight"
  rows = None
  if gate in files:
    reader = SafetensorsFile(files[gate])
    try:
      rows = reader.shape(gate)[0]
    finally:
      reader.close()
  n = len(found) if found else rows
  if n != cfg.num_experts or (rows is not None and rows != cfg.num_experts):
    raise ValueError(
      f"{folder}: the checkpoint holds {n} experts in layer {layer} (router {gate} has {rows} rows) "
      f"but num_experts={cfg.num_experts} in {config_path} (or the num_experts override)"
    )


# ---- saving -------------------------------------------------------------------------------


def _parse_size(size) -> int:
  if isinstance(size, int):
    return size
  s = str(size).strip().upper()
  for unit, mult in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3), ("B", 1)):
    if s.endswith(unit):
      return int(float(s[: -len(unit)]) * mult)
  return int(s)


def save_pretrained(
  model,
  folder: str | os.PathLike,
  *,
  tokenizer_dir: str | os.PathLike | None = None,
  max_shard_size: int | str = "5GB",
  dtype: str | None = None,
) -> str:
  """Writes `model` (CausalLM or Critic) as an HF folder: config.json + model.safetensors, or
  model-0000i-of-0000n.safetensors + model.safetensors.index.json past `max_shard_size` bytes.

  Args:
    tokenizer_dir: copy the tokenizer files found there (tokenizer.json, tokenizer_config.json,
      chat template, generation_config.json, ...) into `folder`.
    dtype: cast tensors to this dtype on save (default: the params' dtype).
  Returns: the folder path.
  """
  folder = os.fspath(folder)
  os.makedirs(folder, exist_ok=True)
  cfg: ModelConfig = model.config
  is_critic = isinstance(model, Critic)
  hf_cfg = cfg.to_hf_dict(critic=is_critic)
  if dtype is not None:
    hf_cfg["dtype"] = dtype
  np_dtype = None if dtype is None else jnp.dtype(dtype)
  limit = _parse_size(max_shard_size)
  for old in os.listdir(folder):  # stale weights from an earlier save would confuse loaders
    if old.endswith(".safetensors") or old == "model.safetensors.index.json":
      os.remove(os.path.join(folder, old))
  shards: list[dict[str, np.ndarray]] = [{}]
  sizes = [0]
  total = 0
  # Grouping needs only sizes, so tensors are pulled to host per shard, not all at once.
  flat = _params_flat(model)
  for path, value in flat:
    name, _ = hf_name(path)
    nbytes = int(np.prod(value.shape)) * (np_dtype or jnp.dtype(value.dtype)).itemsize
    if sizes[-1] and sizes[-1] + nbytes > limit:
      shards.append({})
      sizes.append(0)
    shards[-1][name] = (path, value)
    sizes[-1] += nbytes
    total += nbytes
  n = len(shards)
  weight_map = {}
  for i, shard in enumerate(shards):
    fname = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
    arrays = {}
    for name, (path, value) in shard.items():
      _, transposed = hf_name(path)
      array = np.asarray(jax.device_get(value))
      if np_dtype is not None:
        array = array.astype(np_dtype)
      arrays[name] = np.ascontiguousarray(to_hf_layout(array, transposed))
      weight_map[name] = fname
    save_file(arrays, os.path.join(folder, fname), metadata=SAFE_METADATA)
    del arrays
  if n > 1:
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(hf_cfg, f, indent=2)
  if tokenizer_dir is not None:
    tokenizer_dir = os.fspath(tokenizer_dir)
    copied = 0
    for fname in TOKENIZER_FILES:
      src = os.path.join(tokenizer_dir, fname)
      if os.path.isfile(src) and os.path.abspath(src) != os.path.abspath(os.path.join(folder, fname)):
        shutil.copyfile(src, os.path.join(folder, fname))
        copied += 1
    if not copied and not os.path.isfile(os.path.join(tokenizer_dir, "tokenizer.json")):
      raise FileNotFoundError(f"tokenizer_dir {tokenizer_dir!r} holds none of {TOKENIZER_FILES}")
  return folder
