"""Train a tiny byte-level BPE tokenizer and write it as an HF tokenizer folder.

No model hub is reachable here, so tests and demos build their own vocabulary:

  build_tiny_tokenizer("/tmp/tok", texts, vocab_size=512, template="qwen2.5")
  transformers.AutoTokenizer.from_pretrained("/tmp/tok")        # loads it
  agentfly_jax.agents.load_tokenizer("/tmp/tok")                 # so does the rollout

The folder holds `tokenizer.json` (byte-level BPE, special tokens as single added tokens) and
`tokenizer_config.json` (with `chat_template` and the bos/eos/pad tokens) — the layout HF
checkpoints use.
"""

from __future__ import annotations

import json
import os
from typing import Iterable, Sequence

from agentfly_jax.data.chat_templates import CHAT_TEMPLATES

# Text mixed into every training corpus so that the template's own words and JSON punctuation
# get merges (keeps rendered prompts short).
_TEMPLATE_CORPUS = [
  "You are a helpful assistant.",
  "system",
  "user",
  "assistant",
  "ipython",
  "tool",
  "# Tools\n\nYou may call one or more functions to assist with the user query.",
  "You are provided with function signatures within <tools></tools> XML tags:",
  "For each function call, return a json object with function name and arguments",
  '{"name": "calculator", "arguments": {"expression": "1 + 2"}}',
  '{"type": "function", "function": {"name": "answer", "description": "", "parameters": '
  '{"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}',
  "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024",
  "Thought: I should use a tool.\nAction: calculator\nAction Input: {\"expression\": \"2*3\"}",
  "Observation: 6\nFinal Answer: 6",
  "```python\nprint(1 + 1)\n```",
  "0123456789 +-*/().,:;",
]


def build_tiny_tokenizer(
  out_dir: str | os.PathLike,
  texts: Iterable[str],
  vocab_size: int = 512,
  template: str = "qwen2.5",
  extra_special_tokens: Sequence[str] = (),
) -> str:
  """Trains a byte-level BPE on `texts` and writes an HF tokenizer folder to `out_dir`.

  Args:
    out_dir: folder to create or overwrite files in.
    texts: training corpus (any iterable of strings; the template's own words are added).
    vocab_size: total vocabulary size including the byte alphabet and the special tokens
      (>= 256 + number of special tokens).
    template: "qwen2.5" or "llama3": the chat template and special tokens to install.
    extra_special_tokens: more strings to register as single special tokens.

  Returns:
    out_dir as a string.
  """
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  if template not in CHAT_TEMPLATES:
    raise ValueError(f"build_tiny_tokenizer: template must be one of {sorted(CHAT_TEMPLATES)}, got {template!r}")
  chat_template, specials = CHAT_TEMPLATES[template]
  special_tokens = list(dict.fromkeys([*specials["tokens"], *extra_special_tokens]))
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  if vocab_size < len(alphabet) + len(special_tokens):
    raise ValueError(
      f"build_tiny_tokenizer: vocab_size={vocab_size} is below the byte alphabet "
      f"({len(alphabet)}) + special tokens ({len(special_tokens)})"
    )

  tokenizer = Tokenizer(models.BPE())
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tokenizer.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size, special_tokens=special_tokens, initial_alphabet=alphabet, show_progress=False
  )
  corpus = [str(t) for t in texts] + _TEMPLATE_CORPUS
  tokenizer.train_from_iterator(corpus, trainer=trainer)

  os.makedirs(out_dir, exist_ok=True)
  tokenizer.save(os.path.join(out_dir, "tokenizer.json"))
  added_tokens_decoder = {
    str(tokenizer.token_to_id(t)): {
      "content": t,
      "lstrip": False,
      "normalized": False,
      "rstrip": False,
      "single_word": False,
      "special": True,
    }
    for t in special_tokens
  }
  config = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "chat_template": chat_template,
    "bos_token": specials["bos_token"],
    "eos_token": specials["eos_token"],
    "pad_token": specials["pad_token"],
    "unk_token": None,
    "add_bos_token": False,
    "add_eos_token": False,
    "clean_up_tokenization_spaces": False,
    "model_max_length": 131072,
    "added_tokens_decoder": added_tokens_decoder,
  }
  with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
    json.dump(config, f, indent=2, ensure_ascii=False)
  return str(out_dir)
