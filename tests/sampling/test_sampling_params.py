"""The Sampler protocol's parameters reject bad values with a message naming the field."""

import pytest

from agentfly_jax.sampling import SamplingParams


def test_defaults_are_valid():
  p = SamplingParams()
  assert p.temperature == 1.0 and p.max_new_tokens == 256 and p.stop_token_ids == ()


def test_stop_ids_become_a_tuple_of_ints():
  assert SamplingParams(stop_token_ids=[3, 5]).stop_token_ids == (3, 5)


@pytest.mark.parametrize(
  "kwargs, field",
  [
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
  ],
)
def test_bad_values_name_the_field(kwargs, field):
  with pytest.raises(ValueError, match=field):
    SamplingParams(**kwargs)


def test_top_level_import_is_light():
  import subprocess, sys

  code = "import sys, agentfly_jax; assert 'jax' not in sys.modules, 'importing agentfly_jax pulled in jax'"
  subprocess.run([sys.executable, "-c", code], check=True)
