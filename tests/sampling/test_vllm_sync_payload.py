"""The in-process weight-sync payload: HF names and layout, zero-copy views of the JAX buffers on
whatever device JAX uses (CPU here; run with JAX_PLATFORMS=cuda on a GPU machine for the CUDA
DLPack path). No vLLM needed."""

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from agentfly_jax.models import to_hf_state_dict  # noqa: E402
from agentfly_jax.sampling.vllm_sync import iter_hf_torch_tensors  # noqa: E402
from sampler_testing import make_model  # noqa: E402


@pytest.mark.parametrize("model_type,tie", [("qwen2", False), ("llama", True)])
def test_payload_is_hf_layout_and_shares_the_jax_buffers(model_type, tie):
  from flax import nnx

  model = make_model(model_type, tie=tie, seed=3, vocab_size=64)
  state = nnx.state(model, nnx.Param)
  want = to_hf_state_dict(state)
  pointers = {v[...].unsafe_buffer_pointer() for _, v in nnx.to_flat_state(state)}
  got = dict(iter_hf_torch_tensors(state))
  assert set(got) == set(want)
  backend = jax.default_backend()
  for name, tensor in got.items():
    assert tensor.device.type == ("cuda" if backend == "gpu" else "cpu"), name
    assert tuple(tensor.shape) == want[name].shape, name
    assert tensor.data_ptr() in pointers, f"{name} was copied, not shared"
    np.testing.assert_array_equal(tensor.cpu().numpy(), want[name])


def test_packed_loader_declines_an_incomplete_payload_before_writing_anything():
  """A payload missing a tensor the vLLM model has (here a qkv bias) must not half-update it."""
  pytest.importorskip("vllm")
  from types import SimpleNamespace

  from agentfly_jax.sampling import vllm_sync

  def linear(bias):
    return SimpleNamespace(cpu_linear=None, bias=torch.zeros(3) if bias else None)

  layer = SimpleNamespace(
    self_attn=SimpleNamespace(qkv_proj=linear(True), o_proj=linear(False)),
    mlp=SimpleNamespace(gate_up_proj=linear(False), down_proj=linear(False)),
  )
  embed = torch.zeros(4, 2)
  model = SimpleNamespace(
    config=SimpleNamespace(tie_word_embeddings=True),
    lm_head=object(),
    model=SimpleNamespace(
      embed_tokens=SimpleNamespace(weight=embed), layers=[layer], norm=SimpleNamespace(weight=torch.zeros(2))
    ),
  )
  names = ["model.embed_tokens.weight", "model.norm.weight"] + [
    f"model.layers.0.{n}.weight"
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
  tensors = {n: torch.ones(4, 2) for n in names}  # no self_attn.{q,k,v}_proj.bias
  assert vllm_sync.load_packed_on_cpu(model, tensors) is False
  assert not embed.any()


def test_vllm_cpu_build_beside_libtpu_selects_the_cpu_platform(monkeypatch):
  """jax[tpu] installs libtpu on every machine (compile-only TPU checks): vLLM would probe both TPU
  and CPU; with the vllm-cpu build the CPU platform is set explicitly, a user's choice kept."""
  import importlib.metadata
  from agentfly_jax.sampling.vllm_platform import select_vllm_platform

  try:
    importlib.metadata.version("vllm-cpu")
  except importlib.metadata.PackageNotFoundError:
    pytest.skip("the vllm-cpu build is not installed")
  monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
  assert select_vllm_platform() == "cpu"
  monkeypatch.setenv("VLLM_TARGET_DEVICE", "cuda")
  assert select_vllm_platform() == "cuda"
