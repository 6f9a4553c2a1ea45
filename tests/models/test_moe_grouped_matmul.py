"""moe.grouped_matmul's CPU path (each row against its own expert's kernel, in padded blocks) against
jax.lax.ragged_dot on random inputs: values and gradients, empty groups, rows past the groups' sum, several
block sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentfly_jax.models.moe import _blocked_matmul, grouped_matmul


@pytest.mark.parametrize(
  "m, g, sizes",
  [
    (37, 4, [10, 0, 20, 7]),  # an empty group, every row used
    (64, 3, [5, 30, 9]),  # rows past the sum give 0
    (300, 8, [80, 1, 0, 60, 33, 2, 100, 0]),  # several blocks a group
  ],
)
def test_blocked_matmul_equals_ragged_dot_values_and_gradients(m, g, sizes):
  rng = np.random.default_rng(m + g)
  k, n = 12, 10
  x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((g, k, n)), jnp.float32)
  gs = jnp.asarray(sizes, jnp.int32)
  probe = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)

  def loss(f):
    return lambda x, w: jnp.sum(f(x, w, gs) * probe)

  want = jax.lax.ragged_dot(x, w, gs)
  got = jax.jit(_blocked_matmul)(x, w, gs)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert not np.any(np.asarray(got)[sum(sizes) :])  # rows past the groups' sum: 0
  np.testing.assert_allclose(jax.jit(grouped_matmul)(x, w, gs), want, rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.grad(loss(_blocked_matmul), (0, 1))(x, w), jax.grad(loss(jax.lax.ragged_dot), (0, 1))(x, w)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
