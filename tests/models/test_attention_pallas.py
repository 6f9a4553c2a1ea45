"""attention_impl "pallas" (TPU's Pallas flash-attention kernel, models/pallas_attention.py): the
segment ids it masks by, its block sizes, and its refusal off TPU. Its equality with the
one-square model (interpret mode) is in test_attention_chunked.py, beside the other attention paths."""

import jax.numpy as jnp
import numpy as np
import pytest

from agentfly_jax.models import tiny_config
from agentfly_jax.models.pallas_attention import block_sizes, segment_ids_for


def test_segment_ids_mark_padding_and_keep_segments():
  attn = jnp.asarray([[True, True, False], [False, True, True]])
  seg = jnp.asarray([[1, 2, 0], [0, 1, 1]], jnp.int32)
  np.testing.assert_array_equal(segment_ids_for(attn, None, (2, 3)), [[0, 0, -1], [-1, 0, 0]])
  np.testing.assert_array_equal(segment_ids_for(attn, seg, (2, 3)), [[1, 2, -1], [-1, 1, 1]])
  np.testing.assert_array_equal(segment_ids_for(None, None, (1, 2)), [[0, 0]])


@pytest.mark.parametrize("t,block", [(2048, 512), (768, 256), (384, 128), (128, 128)])
def test_block_sizes_divide_the_length(t, block):
  sizes = block_sizes(t)
  assert sizes.block_q == sizes.block_k_major == sizes.block_q_dkv == block
  assert t % sizes.block_q == 0


def test_block_sizes_name_a_length_off_the_lanes():
  with pytest.raises(ValueError, match="length 100 is not a multiple of 128"):
    block_sizes(100)


def test_unknown_attention_impl_is_named():
  with pytest.raises(ValueError, match="attention_impl 'splash'"):
    tiny_config("qwen2", attention_impl="splash")


def test_a_run_with_pallas_attention_off_tpu_is_refused_naming_the_backend():
  from agentfly_jax.rl.config import default_config
  from agentfly_jax.rl.setup import check_backend
  from agentfly_jax.rl.spec import RunSpec

  config = default_config()
  config.model.attention_impl = "pallas"
  with pytest.raises(ValueError, match="backend is 'cpu': use --config.model.attention_impl=flash"):
    check_backend(RunSpec.from_config(config), "cpu")
  check_backend(RunSpec.from_config(config), "tpu")  # the TPU backend runs it
  config.model.attention_impl = "flash"
  check_backend(RunSpec.from_config(config), "cpu")
