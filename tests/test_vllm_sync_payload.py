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
