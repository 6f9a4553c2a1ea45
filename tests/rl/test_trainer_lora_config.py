"""config.model.lora: validation naming the field, the SmolLM2 LoRA config, what trains (policy
adapters; the critic's adapters + value head), and the JAX sampler's adapter-only sync."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentfly_jax.models import CausalLM, Critic, tiny_config
from agentfly_jax.models.lora import LoRAConfig, apply_lora, lora_config_from
from agentfly_jax.rl.config import default_config, validate_config
from agentfly_jax.rl.spec import RunSpec
from agentfly_jax.rl.setup import trainable_filter

from train_cli import ROOT  # noqa: E402


def _lora_config(**lora):
  c = default_config()
  c.model.lora.update(lora)
  return c


def test_validation_names_the_field():
  validate_config(_lora_config(rank=8))
  validate_config(_lora_config(rank=0, targets="nonsense("))  # off: targets unused
  with pytest.raises(ValueError, match=r"config.model.lora.rank=-2"):
    validate_config(_lora_config(rank=-2))
  with pytest.raises(ValueError, match=r"config.model.lora.alpha must be a number > 0"):
    validate_config(_lora_config(rank=4, alpha=0.0))
  with pytest.raises(ValueError, match=r"config.model.lora.targets: 'q\[' is neither"):
    validate_config(_lora_config(rank=4, targets="q,q["))


def test_smollm2_lora_config_is_valid():
  spec = importlib.util.spec_from_file_location("cfg", os.path.join(ROOT, "configs", "smollm2_arithmetic_lora.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  validate_config(c)
  lora = lora_config_from(c.model.lora)
  assert lora.rank == 16 and lora.scale == 2.0 and len(lora.targets) == 7
  assert c.task == "arithmetic_brief" and c.sft.steps > 0


def test_trainable_filter_policy_and_critic():
  c = _lora_config(rank=2, critic=True)
  critic = apply_lora(Critic(tiny_config("qwen2"), rngs=nnx.Rngs(0)), LoRAConfig(rank=2), rngs=nnx.Rngs(1))
  _, trained, rest = nnx.split(critic, trainable_filter(RunSpec.from_config(c), critic=True), ...)
  names = {str(p[-2]) + "." + str(p[-1]) for p, _ in nnx.to_flat_state(trained)}
  assert {"score.kernel", "score.bias", "q_proj.lora_a", "down_proj.lora_b"} <= names
  assert not any(n.endswith(".kernel") and not n.startswith("score") for n in names)
  assert len(jax.tree.leaves(rest)) > 0
  c.model.lora.critic = False  # the critic then trains whole: every Param, adapters and base
  _, trained, rest = nnx.split(critic, trainable_filter(RunSpec.from_config(c), critic=True), ...)
  assert len(nnx.to_flat_state(trained)) == len(nnx.to_flat_state(nnx.state(critic, nnx.Param)))
  assert not jax.tree.leaves(nnx.state(rest, nnx.Param))
  plain = CausalLM(tiny_config("qwen2"), rngs=nnx.Rngs(0))
  _, trained, _ = nnx.split(plain, trainable_filter(RunSpec()), ...)
  assert len(nnx.to_flat_state(trained)) == len(nnx.to_flat_state(nnx.state(plain, nnx.Param)))


@pytest.mark.slow
def test_jax_sampler_syncs_adapters_only_and_decodes_with_them():
  from agentfly_jax.sampling import JaxSampler, SamplingParams

  model = apply_lora(CausalLM(tiny_config("llama"), rngs=nnx.Rngs(0)), LoRAConfig(rank=4), rngs=nnx.Rngs(1))
  sampler = JaxSampler(model, max_batch_size=2, max_len=64, kernel_layout="out_in", pad_id=0)
  prompts = [[5, 6, 7, 8], [9, 10, 11]]
  greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
  before = sampler.generate(prompts, greedy)
  base_kernels = [v for p, v in nnx.to_flat_state(sampler._decode[1]) if p[-1] == "kernel"]
  adapters = nnx.state(model, nnx.LoRAParam)
  trained = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.key(x.size), x.shape), adapters)
  stats = sampler.update_weights(trained)
  adapter_bytes = sum(x.size * 4 for x in jax.tree.leaves(trained))
  assert stats.bytes == adapter_bytes
  # the transposed base kernels of the decode copy are the same objects: nothing re-made
  after_kernels = [v for p, v in nnx.to_flat_state(sampler._decode[1]) if p[-1] == "kernel"]
  assert all(a is b for a, b in zip(base_kernels, after_kernels))
  got = sampler.generate(prompts, greedy)
  nnx.update(model, trained)
  ref = np.asarray(model(jnp.asarray([prompts[0] + got[0].token_ids[:-1]])))[0, 3:]
  np.testing.assert_array_equal(np.argmax(ref, -1), np.asarray(got[0].token_ids))
  assert [r.token_ids for r in got] != [r.token_ids for r in before]
  with pytest.raises(ValueError, match="the adapters do not match the sampler's model's"):
    other = apply_lora(
      CausalLM(tiny_config("llama"), rngs=nnx.Rngs(0)), LoRAConfig(rank=4, targets="q"), rngs=nnx.Rngs(1)
    )
    sampler.update_weights(nnx.state(other, nnx.LoRAParam))
