"""Shared pytest set-up. Tests run on CPU; multi-device tests start their own subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (see tests/helpers.py)."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
