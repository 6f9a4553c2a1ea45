"""PEFT interop of our LoRA adapters (models/lora_io.py), with HF transformers + peft (torch)
as the reference: exported adapters load in peft with the same logits, peft's adapters load
here with the same logits, and the merged HF folder equals the adapted model."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from flax import nnx  # noqa: E402

from agentfly_jax.models import CausalLM, from_pretrained, save_pretrained, tiny_config  # noqa: E402
from agentfly_jax.models.layers import Linear  # noqa: E402
from agentfly_jax.models.lora import LoRAConfig, apply_lora, target_paths  # noqa: E402
from agentfly_jax.models.lora_io import export_peft, load_peft, save_merged  # noqa: E402

TOL = 1e-4


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def base_folder(request, tmp_path_factory):
  """An HF folder of a random tiny model (llama: untied; qwen2: tied, q/k/v biases)."""
  family = request.param
  model = CausalLM(tiny_config(family, tie_word_embeddings=family == "qwen2"), rngs=nnx.Rngs(3))
  return save_pretrained(model, tmp_path_factory.mktemp(f"base_{family}"))


def _ids(seed=0):
  return np.random.default_rng(seed).integers(0, 256, (2, 24)).astype(np.int32)


def _hf_logits(hf, ids):
  with torch.no_grad():
    return hf(torch.from_numpy(ids.astype(np.int64))).logits.numpy()


def _max_err(a, b):
  return float(np.abs(np.asarray(a) - np.asarray(b)).max())


def test_export_loads_in_peft_with_same_logits(base_folder, tmp_path):
  model = from_pretrained(base_folder)
  apply_lora(model, LoRAConfig(rank=4, alpha=8.0, targets="q,v,o,gate,down"), rngs=nnx.Rngs(0))
  for i, (_, m) in enumerate(nnx.iter_modules(model)):
    if isinstance(m, Linear) and m.lora_b is not None:
      m.lora_b[...] = 0.1 * jax.random.normal(jax.random.key(i), m.lora_b.shape)
  ours = np.asarray(model(jnp.asarray(_ids())))
  folder = export_peft(model, tmp_path / "adapter", base_model_name_or_path=str(base_folder))
  with open(os.path.join(folder, "adapter_config.json")) as f:
    cfg = json.load(f)
  assert cfg["r"] == 4 and cfg["lora_alpha"] == 8.0
  assert sorted(cfg["target_modules"]) == ["down_proj", "gate_proj", "o_proj", "q_proj", "v_proj"]
  hf = transformers.AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32).eval()
  base_logits = _hf_logits(hf, _ids())
  loaded = peft.PeftModel.from_pretrained(hf, folder).eval()
  assert _max_err(_hf_logits(loaded, _ids()), ours) <= TOL
  assert _max_err(base_logits, ours) > 1e-2  # the adapters matter


def test_export_of_some_layers_uses_a_path_pattern_peft_understands(base_folder, tmp_path):
  model = from_pretrained(base_folder)
  apply_lora(model, LoRAConfig(rank=2, alpha=4.0, targets=r"layers\.1\.self_attn\.k_proj"), rngs=nnx.Rngs(0))
  k = model.model.layers[1].self_attn.k_proj
  k.lora_b[...] = 0.3 * jax.random.normal(jax.random.key(9), k.lora_b.shape)
  folder = export_peft(model, tmp_path / "adapter")
  hf = transformers.AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32).eval()
  loaded = peft.PeftModel.from_pretrained(hf, folder).eval()
  assert _max_err(_hf_logits(loaded, _ids(1)), model(jnp.asarray(_ids(1)))) <= TOL


def test_peft_made_adapter_loads_here_with_same_logits(base_folder, tmp_path):
  hf = transformers.AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32).eval()
  torch.manual_seed(0)
  cfg = peft.LoraConfig(
    r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "up_proj", "down_proj"], init_lora_weights=False
  )  # random A and B
  pm = peft.get_peft_model(hf, cfg).eval()
  ref = _hf_logits(pm, _ids(2))
  pm.save_pretrained(tmp_path / "peft")
  model = load_peft(tmp_path / "peft", from_pretrained(base_folder))
  assert len(target_paths(model)) == 2 * 4
  assert _max_err(model(jnp.asarray(_ids(2))), ref) <= TOL


def test_merged_folder_equals_adapted_model(base_folder, tmp_path):
  model = from_pretrained(base_folder)
  apply_lora(model, LoRAConfig(rank=4, alpha=8.0), rngs=nnx.Rngs(0))
  for i, (_, m) in enumerate(nnx.iter_modules(model)):
    if isinstance(m, Linear) and m.lora_b is not None:
      m.lora_b[...] = 0.1 * jax.random.normal(jax.random.key(100 + i), m.lora_b.shape)
  ours = np.asarray(model(jnp.asarray(_ids(3))))
  out = save_merged(model, tmp_path / "merged")
  hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  assert _max_err(_hf_logits(hf, _ids(3)), ours) <= TOL
  assert target_paths(model)  # the model keeps its adapters


def test_load_peft_errors_name_the_field(base_folder, tmp_path):
  model = from_pretrained(base_folder)
  apply_lora(model, LoRAConfig(rank=2, targets="q"), rngs=nnx.Rngs(0))
  folder = export_peft(model, tmp_path / "a")
  with pytest.raises(ValueError, match="already has LoRA adapters"):
    load_peft(folder, model)
  with open(os.path.join(folder, "adapter_config.json")) as f:
    cfg = json.load(f)
  cfg["use_dora"] = True
  with open(os.path.join(folder, "adapter_config.json"), "w") as f:
    json.dump(cfg, f)
  with pytest.raises(ValueError, match="adapter_config.json: use_dora=True is not supported"):
    load_peft(folder, from_pretrained(base_folder))
  with pytest.raises(FileNotFoundError, match="adapter_config.json not found"):
    load_peft(tmp_path / "missing", from_pretrained(base_folder))
