"""Our jinja rendering of chat templates equals HF `apply_chat_template` byte for byte, and the
tokenizer adapter encodes like the HF tokenizer."""

import json
import random

import jinja2
import pytest
import transformers

from agent_testlib import agent_tokenizer, tokenizer_dir
from agentfly_jax.agents import ChatTemplate, TemplatePrefixError, ToolCallAgent, load_chat_template, load_tokenizer
from agentfly_jax.tools import answer, calculator

TEMPLATES = ["qwen2.5", "llama3"]
WORDS = [
  "Oslo",
  "weather",
  "2 + 3",
  "<b>bold</b>",
  "&amp;",
  "Grüße",
  "你好",
  "\"quoted\"",
  "line\nbreak",
  "  padded  ",
  "{json}",
  "émoji 🙂",
  "tab\there",
  "</tool_call>",
]


def _random_text(rng):
  return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))


def _random_arguments(rng):
  args = {}
  for _ in range(rng.randint(0, 3)):
    value = rng.choice(
      [_random_text(rng), rng.randint(-50, 50), rng.random(), True, None, [1, "two"], {"nested": _random_text(rng)}]
    )
    args[rng.choice(["city", "expression", "n", "flag", "items"])] = value
  return args


def _random_conversation(rng, template):
  """system?, user, then turns of assistant (with tool calls or text) and tool results."""
  messages = []
  if rng.random() < 0.7:
    messages.append({"role": "system", "content": _random_text(rng)})
  messages.append({"role": "user", "content": _random_text(rng)})
  for _ in range(rng.randint(0, 3)):
    num_calls = rng.randint(0, 1 if template == "llama3" and rng.random() < 0.5 else 3)
    if num_calls:
      calls = []
      for _ in range(num_calls):
        args = _random_arguments(rng)
        if rng.random() < 0.3:
          args = json.dumps(args)  # arguments given as a JSON string
        call = {"name": rng.choice(["calculator", "get_weather"]), "arguments": args}
        calls.append({"type": "function", "function": call} if rng.random() < 0.8 else call)
      messages.append({"role": "assistant", "content": rng.choice(["", _random_text(rng)]), "tool_calls": calls})
      for _ in range(num_calls):
        messages.append({"role": "tool", "name": "calculator", "content": _random_text(rng)})
    else:
      messages.append({"role": "assistant", "content": _random_text(rng)})
      messages.append({"role": "user", "content": _random_text(rng)})
  return messages


@pytest.fixture(scope="module", params=TEMPLATES)
def both(request):
  folder = tokenizer_dir(request.param)
  return request.param, folder, transformers.AutoTokenizer.from_pretrained(folder)


def test_random_conversations_render_byte_identical_to_hf(both):
  template, folder, hf = both
  ours = load_chat_template(folder)
  rng = random.Random(1234)
  tools = [calculator.schema, answer.schema]
  for i in range(60):
    messages = _random_conversation(rng, template)
    with_tools = tools if rng.random() < 0.6 else None
    add_gen = rng.random() < 0.5
    kwargs = {"date_string": "03 Mar 2025"} if rng.random() < 0.3 else {}
    expected = hf.apply_chat_template(
      messages, tools=with_tools, tokenize=False, add_generation_prompt=add_gen, **kwargs
    )
    got = ours.render(messages, tools=with_tools, add_generation_prompt=add_gen, **kwargs)
    assert got == expected, f"conversation {i} differs:\n{messages}"


def test_fixed_conversation_with_every_role(both):
  template, folder, hf = both
  messages = [
    {"role": "system", "content": "You answer with tools."},
    {"role": "user", "content": "Weather in Oslo and 2+3?"},
    {
      "role": "assistant",
      "content": "Let me check.",
      "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+3"}}},
      ],
    },
    {"role": "tool", "name": "get_weather", "content": "sunny <b>&</b>"},
    {"role": "tool", "name": "calculator", "content": "5"},
    {"role": "assistant", "content": "Sunny; 5."},
    {"role": "user", "content": "Thanks"},
  ]
  if template == "llama3":  # one call per assistant turn is the usual llama form; keep both
    pass
  for add_gen in (False, True):
    expected = hf.apply_chat_template(
      messages, tools=[calculator.schema], tokenize=False, add_generation_prompt=add_gen
    )
    got = load_tokenizer(folder).render(messages, tools=[calculator.schema], add_generation_prompt=add_gen)
    assert got == expected
  assert "<tool_response>" in got if template == "qwen2.5" else "ipython" in got


def test_hf_tokenizer_object_is_accepted_and_encodes_the_same(both):
  _, folder, hf = both
  ours_from_dir = load_tokenizer(folder)
  ours_from_hf = load_tokenizer(hf)
  text = ours_from_dir.render(
    _random_conversation(random.Random(7), "qwen2.5"), tools=[calculator.schema], add_generation_prompt=True
  )
  expected = hf.encode(text, add_special_tokens=False)
  assert ours_from_dir.encode(text) == expected
  assert ours_from_hf.encode(text) == expected
  assert ours_from_dir.decode(expected) == text == ours_from_hf.decode(expected)
  assert ours_from_hf.render([{"role": "user", "content": "hi"}], add_generation_prompt=True) == hf.apply_chat_template(
    [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
  )


HF_FEATURES_TEMPLATE = (
  "{% for m in messages %}{% if loop.index > 3 %}{% break %}{% endif %}"
  "{% if m.role == 'assistant' %}{% generation %}A: {{ m.content }}{{ eos_token }}"
  "{% endgeneration %}{% else %}{{ m.role | upper }}: {{ m.content }}\n{% endif %}"
  "{% endfor %}{{ {'k': '<&>', 'u': 'é'} | tojson(indent=2, sort_keys=True) }}"
  "{% if bos_token is defined %}B{% endif %}{{ strftime_now('%Y') }}"
)


def test_generation_tag_loopcontrols_tojson_options_and_special_tokens(both):
  _, _, hf = both
  messages = [
    {"role": "user", "content": "u1"},
    {"role": "assistant", "content": "a1"},
    {"role": "user", "content": "u2"},
    {"role": "assistant", "content": "dropped"},
  ]
  expected = hf.apply_chat_template(messages, chat_template=HF_FEATURES_TEMPLATE, tokenize=False)
  special = {"eos_token": hf.eos_token, "bos_token": hf.bos_token}
  assert ChatTemplate(HF_FEATURES_TEMPLATE, special).render(messages) == expected
  assert "dropped" not in expected and "<&>" in expected


def test_raise_exception_and_bad_input():
  template = ChatTemplate("{{ raise_exception('no system role here') }}")
  with pytest.raises(jinja2.exceptions.TemplateError, match="no system role here"):
    template.render([{"role": "user", "content": "x"}])
  with pytest.raises(ValueError, match="message 0"):
    template.render([{"content": "no role"}])
  with pytest.raises(ValueError, match="does not compile"):
    ChatTemplate("{% for %}")


def test_chat_template_jinja_file_takes_precedence(tmp_path):
  (tmp_path / "tokenizer_config.json").write_text(
    json.dumps({"chat_template": "CONFIG", "eos_token": {"content": "<e>"}})
  )
  assert load_chat_template(tmp_path).render([]) == "CONFIG"
  (tmp_path / "chat_template.jinja").write_text("FILE{{ eos_token }}")
  assert load_chat_template(tmp_path).render([]) == "FILE<e>"


def test_missing_template_is_a_clear_error(tmp_path):
  (tmp_path / "tokenizer_config.json").write_text("{}")
  with pytest.raises(ValueError, match="no chat template"):
    load_chat_template(tmp_path)


def test_prefix_unstable_template_is_rejected_by_the_agent(tmp_path):
  import shutil

  folder = tmp_path / "tok"
  shutil.copytree(tokenizer_dir("qwen2.5"), folder)
  config = json.loads((folder / "tokenizer_config.json").read_text())
  # Like templates that drop earlier reasoning: the message count leaks into the first line.
  config["chat_template"] = (
    "{{ 'turns=' ~ (messages | length) ~ '\\n' }}{% for m in messages %}"
    "{{ m.role }}: {{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
  )
  (folder / "tokenizer_config.json").write_text(json.dumps(config))
  with pytest.raises(TemplatePrefixError, match="not prefix-stable"):
    ToolCallAgent(str(folder), tools=[calculator])


def test_special_tokens_are_single_tokens():
  tok = agent_tokenizer("qwen2.5")
  for s in ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"]:
    assert len(tok.encode(s)) == 1 and tok.decode(tok.encode(s)) == s
