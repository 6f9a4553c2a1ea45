"""logprob_mismatch_metrics against float64 numpy formulas on fresh random inputs."""

import jax
import numpy as np
import pytest

from agentfly_jax.sampling import logprob_mismatch_metrics


def _reference(s, t, m):
  d = (t - s)[m]
  r = np.exp(d)
  return {
    "mean_abs_diff": np.abs(d).mean(),
    "max_abs_diff": np.abs(d).max(),
    "mean_diff": d.mean(),
    "kl_k1": -d.mean(),
    "kl_k3": (r - 1 - d).mean(),
    "ratio_mean": r.mean(),
    "ratio_max": r.max(),
    "ratio_min": r.min(),
    "num_tokens": float(m.sum()),
  }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_numpy_float64(seed):
  rng = np.random.default_rng(seed)
  s = rng.uniform(-6, 0, (4, 13))
  t = s + rng.normal(0, 0.3, s.shape)
  m = rng.random(s.shape) < 0.6
  m[0, 0] = True
  got = jax.jit(logprob_mismatch_metrics)(s.astype(np.float32), t.astype(np.float32), m)
  want = _reference(s, t, m)
  assert set(got) == set(want)
  for k in want:
    np.testing.assert_allclose(float(got[k]), want[k], rtol=2e-5, atol=2e-6, err_msg=k)


def test_masked_positions_are_ignored_and_equal_inputs_give_zero():
  rng = np.random.default_rng(3)
  s = rng.uniform(-5, 0, (2, 6)).astype(np.float32)
  m = np.array([[1, 1, 0, 0, 1, 0], [0, 1, 1, 0, 0, 0]], bool)
  t = np.where(m, s, s + 100.0)  # huge differences only where masked
  got = logprob_mismatch_metrics(s, t, m)
  for k in ("mean_abs_diff", "max_abs_diff", "kl_k1", "kl_k3"):
    assert float(got[k]) == 0.0, k
  assert float(got["ratio_max"]) == 1.0 and float(got["num_tokens"]) == 5


def test_empty_mask_gives_zeros_not_nans():
  z = np.zeros((2, 3), np.float32)
  got = logprob_mismatch_metrics(z, z - 1, np.zeros((2, 3), bool))
  assert all(np.isfinite(float(v)) for v in got.values())
  assert float(got["mean_abs_diff"]) == 0.0 and float(got["num_tokens"]) == 0.0


def test_shape_mismatch_is_rejected():
  with pytest.raises(AssertionError):
    logprob_mismatch_metrics(np.zeros((2, 3)), np.zeros((2, 4)), np.ones((2, 3), bool))
