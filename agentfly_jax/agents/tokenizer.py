"""What the rollout needs from a tokenizer: ids <-> text without added specials, the chat
template, and the end-of-turn ids.

  tok = load_tokenizer("/path/to/hf_tokenizer_dir")   # tokenizer.json + tokenizer_config.json
  tok = load_tokenizer(transformers_tokenizer)          # or an HF tokenizer object
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from agentfly_jax.agents.chat_template import SPECIAL_TOKEN_KEYS, ChatTemplate, _token_content, load_chat_template


# Texts longer than this are tokenized by `tokenizers`' encode_batch, which releases the GIL (its `encode` holds it:
# a 480 kB text held another thread for 0.32 s, encode_batch for 0.015 s); shorter ones by `encode` (no batch setup).
GIL_FREE_CHARS = 1 << 14


class AgentTokenizer:
  """Encode/decode + chat template, backed by a `tokenizers.Tokenizer` or an HF tokenizer."""

  def __init__(self, backend: Any, chat_template: ChatTemplate, special_tokens: dict[str, str], is_hf: bool):
    self._backend = backend
    self._is_hf = is_hf
    self.chat_template = chat_template
    self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}

  # -- ids <-> text --------------------------------------------------------------------------
  def encode(self, text: str) -> list[int]:
    """Ids of `text`, special-token strings in it parsed as single tokens, nothing added."""
    if self._is_hf:
      return list(self._backend.encode(text, add_special_tokens=False))
    if len(text) > GIL_FREE_CHARS:  # `encode_batch` tokenizes without the GIL: other threads run meanwhile
      return list(self._backend.encode_batch([text], add_special_tokens=False)[0].ids)
    return list(self._backend.encode(text, add_special_tokens=False).ids)

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    ids = [int(i) for i in ids]
    if self._is_hf:
      return self._backend.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)
    return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

  def token_to_id(self, token: str) -> int | None:
    if self._is_hf:
      tid = self._backend.convert_tokens_to_ids(token)
      return None if tid is None or tid == getattr(self._backend, "unk_token_id", -1) else int(tid)
    tid = self._backend.token_to_id(token)
    return None if tid is None else int(tid)

  def get_vocab(self) -> dict[str, int]:
    """token -> id, added tokens included."""
    if self._is_hf:
      return dict(self._backend.get_vocab())
    return dict(self._backend.get_vocab(with_added_tokens=True))

  @property
  def vocab_size(self) -> int:
    if self._is_hf:
      return len(self._backend)
    return self._backend.get_vocab_size(with_added_tokens=True)

  @property
  def eos_token_id(self) -> int | None:
    eos = self.special_tokens.get("eos_token")
    return None if eos is None else self.token_to_id(eos)

  @property
  def pad_token_id(self) -> int:
    pad = self.special_tokens.get("pad_token") or self.special_tokens.get("eos_token")
    tid = None if pad is None else self.token_to_id(pad)
    return 0 if tid is None else tid

  def render(self, messages, tools=None, add_generation_prompt=False, **kwargs) -> str:
    return self.chat_template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs)


def load_tokenizer(tokenizer_dir_or_tokenizer: Any) -> AgentTokenizer:
  """An `AgentTokenizer` from an HF tokenizer folder path, an HF tokenizer object, or itself."""
  if isinstance(tokenizer_dir_or_tokenizer, AgentTokenizer):
    return tokenizer_dir_or_tokenizer
  if isinstance(tokenizer_dir_or_tokenizer, (str, os.PathLike)):
    path = os.fspath(tokenizer_dir_or_tokenizer)
    tokenizer_json = os.path.join(path, "tokenizer.json")
    if not os.path.exists(tokenizer_json):
      raise FileNotFoundError(
        f"load_tokenizer: {tokenizer_json} does not exist (an HF tokenizer "
        f"folder needs tokenizer.json + tokenizer_config.json)"
      )
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(tokenizer_json)
    config_path = os.path.join(path, "tokenizer_config.json")
    config = {}
    if os.path.exists(config_path):
      with open(config_path) as f:
        config = json.load(f)
    special = {k: _token_content(config.get(k)) for k in SPECIAL_TOKEN_KEYS}
    return AgentTokenizer(backend, load_chat_template(path), special, is_hf=False)
  hf = tokenizer_dir_or_tokenizer
  if not (hasattr(hf, "encode") and hasattr(hf, "decode") and hasattr(hf, "chat_template")):
    raise TypeError(f"load_tokenizer: expected a tokenizer folder path or an HF tokenizer, got {type(hf).__name__}")
  if not hf.chat_template:
    raise ValueError("load_tokenizer: the HF tokenizer has no chat_template")
  special = {k: getattr(hf, k, None) for k in SPECIAL_TOKEN_KEYS}
  special = {k: (v if isinstance(v, str) else None) for k, v in special.items()}
  return AgentTokenizer(hf, ChatTemplate(hf.chat_template, special), special, is_hf=True)
