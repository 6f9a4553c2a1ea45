"""Render a tokenizer's own jinja chat template, byte-identical to HF `apply_chat_template`.

The jinja environment matches the one transformers builds: a sandboxed immutable environment
with `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `{% generation %}` block
tag (rendered transparently), a `tojson` filter that does not escape HTML and accepts `indent`,
`separators`, `sort_keys` and `ensure_ascii`, and the globals `raise_exception` and
`strftime_now`. The special tokens of the tokenizer (`bos_token`, `eos_token`, ...) are passed
as template variables, extra keyword arguments override them.

  template = load_chat_template("/path/to/tokenizer_dir")
  text = template.render(messages, tools=[schema, ...], add_generation_prompt=True)
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class _GenerationBlock(jinja2.ext.Extension):
  """`{% generation %}...{% endgeneration %}` renders its body unchanged (HF marks assistant
  spans with it; we only need the text)."""

  tags = {"generation"}

  def parse(self, parser):
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
    return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

  def _render_body(self, caller):
    return caller()


def _raise_exception(message):
  raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
  return datetime.datetime.now().strftime(fmt)


def make_jinja_environment() -> ImmutableSandboxedEnvironment:
  """The jinja environment HF chat templates are written for."""
  env = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
  )
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise_exception
  env.globals["strftime_now"] = _strftime_now
  return env


class ChatTemplate:
  """A compiled chat template plus the special-token variables it is rendered with."""

  def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None):
    if not isinstance(source, str) or not source.strip():
      raise ValueError("ChatTemplate: the template source must be a non-empty jinja string")
    self.source = source
    self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
    try:
      self._compiled = make_jinja_environment().from_string(source)
    except jinja2.TemplateSyntaxError as e:
      raise ValueError(f"ChatTemplate: the chat template does not compile (line {e.lineno}): {e.message}") from e

  def render(
    self,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping] | None = None,
    add_generation_prompt: bool = False,
    **kwargs,
  ) -> str:
    """Renders `messages` (+ optional tool JSON schemas) the way HF `apply_chat_template(...,
    tokenize=False)` does; `kwargs` become template variables (e.g. `date_string`)."""
    for i, m in enumerate(messages):
      if not isinstance(m, Mapping) or "role" not in m:
        raise ValueError(f"ChatTemplate.render: message {i} must be a dict with a 'role', got {m!r}")
    tools = list(tools) if tools is not None else None
    if tools is not None:
      for i, t in enumerate(tools):
        if not isinstance(t, Mapping):
          raise ValueError(f"ChatTemplate.render: tools[{i}] must be a JSON-schema dict, got {t!r}")
    variables = {**self.special_tokens, **kwargs}
    return self._compiled.render(
      messages=list(messages), tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **variables
    )


def _token_content(value) -> str | None:
  if isinstance(value, Mapping):
    return value.get("content")
  return value


def load_chat_template(tokenizer_dir: str | os.PathLike, name: str = "default") -> ChatTemplate:
  """Loads the chat template of an HF tokenizer folder.

  Looks in `chat_template.jinja` (newer HF layout), then `tokenizer_config.json["chat_template"]`
  (a string, or a list of {"name", "template"} of which `name` is taken).
  """
  tokenizer_dir = os.fspath(tokenizer_dir)
  config_path = os.path.join(tokenizer_dir, "tokenizer_config.json")
  config = {}
  if os.path.exists(config_path):
    try:
      with open(config_path) as f:
        config = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{config_path}: not valid JSON ({e})") from e
  special = {k: _token_content(config.get(k)) for k in SPECIAL_TOKEN_KEYS}
  jinja_path = os.path.join(tokenizer_dir, "chat_template.jinja")
  if os.path.exists(jinja_path):
    with open(jinja_path) as f:
      return ChatTemplate(f.read(), special)
  source = config.get("chat_template")
  if isinstance(source, list):
    by_name = {t.get("name"): t.get("template") for t in source if isinstance(t, Mapping)}
    if name not in by_name:
      raise ValueError(
        f"{config_path}: field 'chat_template' has no template named {name!r} (has {sorted(k for k in by_name if k)})"
      )
    source = by_name[name]
  if not source:
    raise ValueError(
      f"{tokenizer_dir}: no chat template (neither chat_template.jinja nor the "
      f"'chat_template' field of tokenizer_config.json)"
    )
  return ChatTemplate(source, special)
