"""Run in the 8-device child process (tests/eight_device_checks.py): the JAX sampler with params
sharded on a (fsdp=2, tp=4) mesh samples the same tokens and log-probs as unsharded, and its CPU
decode copy keeps the (transposed) sharding (prints SHARDED_OK); the paged engine on that mesh samples the same
tokens too (prints PAGED_SHARDED_OK)."""

import jax
import numpy as np
from flax import nnx

from agentfly_jax.models import make_mesh, shard_model
from agentfly_jax.sampling import JaxSampler, SamplingParams
from agentfly_jax.sampling.engine import PagedJaxSampler
from sampler_testing import PROMPTS, make_model


def main():
  assert jax.device_count() == 8
  model = make_model(seed=3)
  plain = JaxSampler(model, max_batch_size=4, max_len=32)
  params = SamplingParams(temperature=0.8, max_new_tokens=6, seed=9)
  want = plain.generate(PROMPTS, params)
  mesh = make_mesh(fsdp=2, tp=4)
  shard_model(model, mesh)  # the models package's partition rules, in place
  sharded = nnx.state(model, nnx.Param)
  assert any(len(l.sharding.device_set) == 8 for l in jax.tree.leaves(sharded))
  sampler = JaxSampler(model, max_batch_size=4, max_len=32)
  sampler.update_weights(sharded)
  # The CPU decode copy has [out, in] kernels that keep the (transposed) sharding.
  decode = dict(nnx.to_flat_state(sampler._decode[1]))
  up = decode[("model", "layers", 0, "mlp", "up_proj", "kernel")][...]
  spec = tuple(up.sharding.spec) + (None,) * (2 - len(up.sharding.spec))
  assert sampler.kernel_layout == "out_in" and spec == ("tp", "fsdp"), up.sharding
  got = sampler.generate(PROMPTS, params)
  for g, w in zip(got, want):
    assert g.token_ids == w.token_ids, (g, w)
    np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=1e-4, atol=1e-4)
  print("SHARDED_OK")
  paged = PagedJaxSampler(
    model, num_slots=4, max_len=32, page_size=4, mesh=mesh, decode_batches=(4,), prefill_chunks=(8,), prefill_tokens=32
  )
  for g, w in zip(paged.generate(PROMPTS, params), want):
    assert g.token_ids == w.token_ids, (g, w)
    np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=1e-4, atol=1e-4)
  print("PAGED_SHARDED_OK")


if __name__ == "__main__":
  main()
