"""Pushing JAX params into a running vLLM engine without touching persistent disk.

Two transports, one worker-side function (`reload_worker_weights`, sent with
`LLM.collective_rpc`; module-level so it pickles by reference):

* **in-process engine** (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the default of `VllmSampler`): the
  worker runs in this process, so the payload is a list of `(hf_name, torch.Tensor)` made with
  `torch.from_dlpack` straight from the JAX arrays: zero-copy for single-device arrays (CPU here;
  on a GPU machine the same code hands CUDA buffers to vLLM without a host round trip —
  **GPU path not tested on the CPU CI machine**). Params whose layout differs from HF's are
  transposed on device first (one device copy); sharded arrays are gathered to the host.
* **engine in another process**: the payload is one safetensors blob (`bytes`; dicts of tensors
  do not survive vLLM's RPC serialisation, bytes do). Needs `VLLM_ALLOW_INSECURE_SERIALIZATION=1`
  for the callable.

On the worker, `model_runner.reload_weights(weights_iterator=...)` loads the tensors in place and
re-runs each layer's post-load processing (on CPU: weight prepacking). **Tied embeddings on
CPU:** the lm_head shares `embed_tokens.weight`, so the reload never visits the lm_head layer and
its prepacked GEMM copy (`lm_head.cpu_linear`) keeps the old embedding; we re-tie the parameter
and re-run `dispatch_cpu_unquantized_gemm` on the lm_head after every reload.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np


def iter_hf_torch_tensors(params: Any) -> Iterator[tuple[str, Any]]:
  """(hf_name, torch.Tensor) in HF layout from a model / nnx.State, via DLPack (zero-copy where
  the array already has HF layout and lives on one device)."""
  import jax
  import jax.numpy as jnp
  import torch
  from flax import nnx

  from agentfly_jax.models import hf_name

  state = nnx.state(params, nnx.Param) if isinstance(params, nnx.Module) else params
  for path, var in nnx.to_flat_state(state):
    value = var[...] if isinstance(var, nnx.Variable) else var
    name, transposed = hf_name(path)
    if isinstance(value, jax.Array) and len(value.sharding.device_set) == 1:
      array = jnp.transpose(value) if transposed else value
      yield name, torch.from_dlpack(array)
    else:  # sharded (or numpy): gather on the host
      host = np.asarray(jax.device_get(value))
      yield name, torch.from_numpy(np.ascontiguousarray(host.T if transposed else host))


def safetensors_blob(params: Any) -> bytes:
  """All params as one safetensors blob (HF names and layout), for an engine in another process."""
  import safetensors.numpy

  from agentfly_jax.models import to_hf_state_dict
  return safetensors.numpy.save(to_hf_state_dict(params))


def reload_worker_weights(worker: Any, payload: Any, refresh_tied_lm_head: bool = True) -> dict:
  """Runs on a vLLM worker (via `collective_rpc`): loads `payload` in place.

  Args:
    worker: the vLLM worker (passed by collective_rpc).
    payload: safetensors `bytes`, or a list of `(hf_name, torch.Tensor)`.
    refresh_tied_lm_head: re-tie and re-pack a tied lm_head after the reload (see the module
      docstring). Only tests turn it off, to show the bug it fixes.
  Returns:
    {"num_tensors": int, "tied_lm_head_refreshed": bool}.
  """
  if isinstance(payload, (bytes, bytearray)):
    import safetensors.torch
    tensors = list(safetensors.torch.load(bytes(payload)).items())
  else:
    tensors = list(payload)
  runner = worker.model_runner
  runner.reload_weights(weights_iterator=iter(tensors))
  refreshed = False
  if refresh_tied_lm_head:
    refreshed = refresh_tied_lm_head_on_cpu(runner.get_model())
  return {"num_tensors": len(tensors), "tied_lm_head_refreshed": refreshed}


def refresh_tied_lm_head_on_cpu(model: Any) -> bool:
  """Re-ties `lm_head.weight` to the embedding and rebuilds its CPU GEMM; True if it did."""
  from vllm.platforms import current_platform

  config = getattr(model, "config", None)
  lm_head = getattr(model, "lm_head", None)
  embed = getattr(getattr(model, "model", None), "embed_tokens", None)
  if not (getattr(config, "tie_word_embeddings", False) and lm_head is not None and embed is not None):
    return False
  if lm_head.weight is not embed.weight:
    lm_head.weight = embed.weight
  if current_platform.is_cpu() and hasattr(lm_head, "cpu_linear"):
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    dispatch_cpu_unquantized_gemm(lm_head, remove_weight=False)
  return True
