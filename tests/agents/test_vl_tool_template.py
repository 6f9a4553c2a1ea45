"""The "qwen2.5-vl" chat template of a random-init vision-language policy: Qwen2.5's tool template with image
parts. Text-only conversations render exactly as "qwen2.5"; image parts render as the published Qwen2.5-VL
template renders them; its tiny tokenizer holds the vision tokens as single ids, the ids the model config takes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agentfly_jax.agents import load_tokenizer
from agentfly_jax.agents.chat_template import ChatTemplate
from agentfly_jax.data.chat_templates import CHAT_TEMPLATES
from agentfly_jax.data.tiny_tokenizer import build_tiny_tokenizer
from agentfly_jax.vision.processor import QWEN25_VL_CHAT_TEMPLATE

TOOLS = [
  {
    "type": "function",
    "function": {
      "name": "look",
      "description": "Looks.",
      "parameters": {"type": "object", "properties": {"at": {"type": "string"}}, "required": ["at"]},
    },
  }
]


def _template(name):
  source, specials = CHAT_TEMPLATES[name]
  return ChatTemplate(source, {"eos_token": specials["eos_token"]})


def _random_text_conversation(rng):
  words = ["cat", "7", "{x}", "<b>", "line\nbreak", "über", "  spaced "]
  say = lambda: " ".join(rng.choice(words, size=int(rng.integers(1, 6))))  # noqa: E731
  messages = [{"role": "system", "content": say()}] if rng.random() < 0.5 else []
  messages.append({"role": "user", "content": say()})
  for _ in range(int(rng.integers(1, 4))):
    call = {"name": "look", "arguments": {"at": say()}}
    messages.append({"role": "assistant", "content": say() if rng.random() < 0.5 else "", "tool_calls": [call]})
    messages.append({"role": "tool", "content": say()})
  messages.append({"role": "assistant", "content": say()})
  return messages


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_text_only_conversations_render_as_qwen25(seed):
  rng = np.random.default_rng(seed)
  messages = _random_text_conversation(rng)
  for tools in (None, TOOLS):
    for gen in (False, True):
      want = _template("qwen2.5").render(messages, tools, add_generation_prompt=gen)
      assert _template("qwen2.5-vl").render(messages, tools, add_generation_prompt=gen) == want


def test_image_parts_render_as_the_published_vl_template():
  image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
  messages = [
    {"role": "system", "content": "Look closely."},
    {"role": "user", "content": [{"type": "text", "text": "first "}, image, {"type": "text", "text": " then"}, image]},
    {"role": "assistant", "content": "two pictures"},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and this?"}]},
  ]
  published = ChatTemplate(QWEN25_VL_CHAT_TEMPLATE)
  ours = _template("qwen2.5-vl")
  for gen in (False, True):
    assert ours.render(messages, add_generation_prompt=gen) == published.render(messages, add_generation_prompt=gen)
  # a tool's image reply sits inside its tool_response, the tools listed as Qwen2.5 lists them
  call = {"name": "look", "arguments": {"at": "door"}}
  tool_turn = [
    {"role": "user", "content": "go"},
    {"role": "assistant", "content": "", "tool_calls": [call]},
    {"role": "tool", "content": [{"type": "text", "text": "the door:"}, image]},
  ]
  text = ours.render(tool_turn, TOOLS, add_generation_prompt=True)
  assert "<tool_response>\nthe door:<|vision_start|><|image_pad|><|vision_end|>\n</tool_response>" in text
  assert json.dumps(TOOLS[0]) in text and text.endswith("<|im_start|>assistant\n")


def test_tiny_vl_tokenizer_holds_the_vision_tokens_the_model_takes(tmp_path):
  from agentfly_jax.rl.setup import vision_token_ids

  build_tiny_tokenizer(tmp_path, ["a picture of a cat", "the door"], vocab_size=400, template="qwen2.5-vl")
  tok = load_tokenizer(str(tmp_path))
  ids = vision_token_ids(tok)
  assert len(set(ids.values())) == 4 and all(0 <= i < tok.vocab_size for i in ids.values())
  placeholder = tok.encode("x<|vision_start|><|image_pad|><|image_pad|><|vision_end|>")
  assert placeholder[-4:] == [
    ids["vision_start_token_id"],
    ids["image_token_id"],
    ids["image_token_id"],
    ids["vision_end_token_id"],
  ]
  text_only = tmp_path / "text"
  build_tiny_tokenizer(text_only, ["a cat"], vocab_size=400, template="qwen2.5")
  with pytest.raises(ValueError, match=r"needs the tokens \['<\|image_pad\|>'"):
    vision_token_ids(load_tokenizer(str(text_only)))
