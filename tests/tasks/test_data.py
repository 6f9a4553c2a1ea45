"""Dataset rows (clear errors naming file/row/field), the tiny tokenizer builder, pad_batch."""

import json
import re

import numpy as np
import pytest
import transformers

from agentfly_jax.agents import Trajectory, pad_batch
from agentfly_jax.data import RowStream, build_tiny_tokenizer, load_rows


def test_load_rows_json_and_jsonl(tmp_path):
  rows = [{"question": "2+2?", "answer": "4", "tools": ["calculator"]}, {"question": "Hi"}]
  path = tmp_path / "train.json"
  path.write_text(json.dumps(rows))
  assert load_rows(path) == rows
  jl = tmp_path / "train.jsonl"
  jl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  assert load_rows(jl) == rows


@pytest.mark.parametrize("n", [1, 2, 3])
def test_jsonl_files_read_line_by_line_at_any_length(tmp_path, n):
  """A `.jsonl` file is JSON Lines whatever its length: one row (the Harbor docstring's form) is one
  object, which whole-file JSON would read as a dict; blank lines are skipped; errors name the line."""
  rows = [{"question": f"q{i}", "answer": str(i)} for i in range(n)]
  path = tmp_path / "rows.jsonl"
  path.write_text("\n\n".join(json.dumps(r) for r in rows) + "\n")
  assert load_rows(path) == rows
  path.write_text(json.dumps(rows[0]) + "\n" + '{"answer": "x"}\n')
  with pytest.raises(ValueError, match=r"row 1 \(line 2\) has no field 'question'"):
    load_rows(path)
  path.write_text(json.dumps(rows))  # a JSON list in a .jsonl file: its one line is no row object
  with pytest.raises(ValueError, match=r"row 0 \(line 1\) must be a JSON object"):
    load_rows(path)


@pytest.mark.parametrize(
  "content, message",
  [
    ('[{"question": "a"}, {"answer": "b"}]', "row 1 has no field 'question'"),
    ('[{"question": ""}]', "row 0 field 'question' must be a non-empty string"),
    ('[{"question": 3}]', "row 0 field 'question' must be a non-empty string"),
    ('[{"question": "a"}, "text"]', "row 1 must be a JSON object"),
    ('[{"question": "a", "tools": "calc"}]', "row 0 field 'tools' must be a list"),
    ('{"question": "a"}', "expected a JSON list of rows"),
    ('[]', "the list of rows is empty"),
    ('[{"question": "a"},', "not valid JSON"),
  ],
)
def test_malformed_files_name_file_row_and_field(tmp_path, content, message):
  path = tmp_path / "bad.json"
  path.write_text(content)
  with pytest.raises(ValueError, match=message) as info:
    load_rows(path)
  assert str(path) in str(info.value)


def test_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.json"):
    load_rows(tmp_path / "nope.json")


def test_row_stream_is_real_epochs_reshuffled_per_epoch():
  """Every row once per epoch (a file's rows form real epochs), each epoch in its own seeded order,
  positions read the same across calls and epoch boundaries (a resumed run reads on where it stopped)."""
  rng = np.random.default_rng()
  n = int(rng.integers(5, 40))
  rows = [{"question": f"q{i}"} for i in range(n)]
  stream = RowStream(rows, seed=3)
  epochs = [stream.at(e * n, n) for e in range(4)]
  for epoch in epochs:
    assert sorted(r["question"] for r in epoch) == sorted(r["question"] for r in rows)
  assert len({tuple(r["question"] for r in e) for e in epochs}) == 4  # reshuffled per epoch
  k = int(rng.integers(1, n))
  assert stream.at(k, 2 * n) == epochs[0][k:] + epochs[1] + epochs[2][:k]
  assert RowStream(rows, seed=3).at(0, n) == epochs[0] and RowStream(rows, seed=4).at(0, n) != epochs[0]
  with pytest.raises(ValueError, match="no rows"):
    RowStream([], seed=0)


@pytest.mark.parametrize(
  "template, specials",
  [
    ("qwen2.5", ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"]),
    ("llama3", ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]),
  ],
)
def test_tiny_tokenizer_loads_in_hf(tmp_path, template, specials):
  texts = ["the quick brown fox jumps over the lazy dog"] * 20
  folder = build_tiny_tokenizer(
    tmp_path / "tok", texts, vocab_size=400, template=template, extra_special_tokens=["<extra>"]
  )
  hf = transformers.AutoTokenizer.from_pretrained(folder)
  assert len(hf) <= 400 and hf.chat_template
  for s in specials + ["<extra>"]:
    ids = hf.encode(s, add_special_tokens=False)
    assert len(ids) == 1, s
  text = "the quick brown fox"
  ids = hf.encode(text, add_special_tokens=False)
  assert hf.decode(ids) == text and len(ids) < len(text)  # merges were learned
  assert hf.eos_token in specials


def test_tiny_tokenizer_bad_arguments(tmp_path):
  with pytest.raises(ValueError, match="template must be one of"):
    build_tiny_tokenizer(tmp_path, ["x"], template="mistral")
  with pytest.raises(ValueError, match="vocab_size=100"):
    build_tiny_tokenizer(tmp_path, ["x"], vocab_size=100)


def _random_trajectory(rng, group_id, length):
  mask = rng.random(length) < 0.5
  return Trajectory(
    token_ids=rng.integers(1, 500, length),
    action_mask=mask,
    sampler_logprobs=np.where(mask, -rng.random(length), 0.0),
    reward=float(rng.normal()),
    group_id=group_id,
    chain_id=0,
  )


def test_pad_batch_right_pads_against_a_loop_reference():
  rng = np.random.default_rng(0)
  trajs = [_random_trajectory(rng, g, n) for g, n in [(0, 7), (0, 3), (1, 11), (2, 1)]]
  batch = pad_batch(trajs, pad_id=-1)
  assert batch["token_ids"].shape == (4, 11) and batch["token_ids"].dtype == np.int32
  assert batch["action_mask"].dtype == bool and batch["attention_mask"].dtype == bool
  assert batch["sampler_logprobs"].dtype == np.float32 and batch["rewards"].dtype == np.float32
  for i, t in enumerate(trajs):
    n = len(t)
    for j in range(11):
      if j < n:
        assert batch["token_ids"][i, j] == t.token_ids[j]
        assert batch["action_mask"][i, j] == t.action_mask[j] and batch["attention_mask"][i, j]
        assert batch["sampler_logprobs"][i, j] == np.float32(t.sampler_logprobs[j])
      else:
        assert batch["token_ids"][i, j] == -1 and not batch["attention_mask"][i, j]
        assert not batch["action_mask"][i, j] and batch["sampler_logprobs"][i, j] == 0
  np.testing.assert_array_equal(batch["group_ids"], [0, 0, 1, 2])
  np.testing.assert_allclose(batch["rewards"], [t.reward for t in trajs], rtol=1e-6)
  assert pad_batch(trajs, max_len=16)["token_ids"].shape == (4, 16)


def test_pad_batch_and_trajectory_errors():
  rng = np.random.default_rng(1)
  trajs = [_random_trajectory(rng, 0, 5), _random_trajectory(rng, 0, 9)]
  with pytest.raises(ValueError, match=r"trajectories\[1\].*9 tokens > max_len=8"):
    pad_batch(trajs, max_len=8)
  with pytest.raises(ValueError, match="no trajectories"):
    pad_batch([])
  with pytest.raises(TypeError, match=r"trajectories\[0\]"):
    pad_batch([{"token_ids": [1]}])
  with pytest.raises(ValueError, match="one length"):
    Trajectory(token_ids=[1, 2], action_mask=[True], sampler_logprobs=[0.0, 0.0])


def test_mask_segments_and_format_trajectory():
  from agent_testlib import agent_tokenizer
  from agentfly_jax.agents import format_trajectory, mask_segments

  tok = agent_tokenizer("qwen2.5")
  prompt, reply, obs = tok.encode("Hi<|im_end|>"), tok.encode("Hello<|im_end|>"), tok.encode("\nok")
  ids = prompt + reply + obs
  mask = [False] * len(prompt) + [True] * len(reply) + [False] * len(obs)
  t = Trajectory(
    token_ids=ids, action_mask=mask, sampler_logprobs=np.zeros(len(ids)), finish_reason="no_tool_call", num_turns=1
  )
  n = len(prompt)
  assert mask_segments(t.action_mask) == [(0, n, False), (n, n + len(reply), True), (n + len(reply), len(ids), False)]
  assert mask_segments(np.zeros(0, bool)) == []
  text = format_trajectory(t, tok, color=False)
  assert text.splitlines()[0].startswith("group 0 chain 0 | ")
  assert text.endswith("Hi<|im_end|>⟦Hello<|im_end|>⟧\nok")
  assert "\033[42;30mHello<|im_end|>\033[0m" in format_trajectory(t, tok, color=True)


def test_trajectory_json_round_trip():
  rng = np.random.default_rng(2)
  t = _random_trajectory(rng, 3, 6)
  t.messages = [{"role": "user", "content": "q"}]
  t.reward_metrics = {"turns": 1.0}
  d = json.loads(json.dumps(t.to_json_dict()))
  back = Trajectory(**d)
  np.testing.assert_array_equal(back.token_ids, t.token_ids)
  np.testing.assert_array_equal(back.action_mask, t.action_mask)
  np.testing.assert_array_equal(back.sampler_logprobs, t.sampler_logprobs)
  assert back.messages == t.messages and back.group_id == 3 and back.reward == t.reward


def test_a_tasks_rows_file_is_checked_once_errors_naming_file_and_line(tmp_path, monkeypatch):
  """config.task.train_path's rows are parsed (data/dataset.read_rows), then checked once as they enter the task
  (tasks/contract.checked_rows): one validate_row per row; every row error names the file, the row and its
  JSON Lines line (the row's shape, a field the reward reads, a tool it names)."""
  from agentfly_jax.data import dataset
  from agentfly_jax.rl.config import default_config
  from agentfly_jax.tasks import contract
  from agentfly_jax.tasks.from_config import build_task, set_custom_task

  calls, validate_row = [], dataset.validate_row

  def counted(row, index, source="rows", line=None):
    calls.append(index)
    return validate_row(row, index, source, line)

  monkeypatch.setattr(dataset, "validate_row", counted)
  monkeypatch.setattr(contract, "validate_row", counted)
  path = tmp_path / "rows.jsonl"

  def build(*lines):
    path.write_text("\n".join(lines) + "\n")
    config = set_custom_task(default_config(), train_path=str(path), tools="calculator", reward="exact_match")
    return build_task(config)

  good = '{"question": "2+2?", "answer": "4"}'
  task = build(good, "", '{"question": "3+3?", "answer": "6", "tools": ["calculator"]}')
  assert [r["answer"] for r in task.rows] == ["4", "6"] and sorted(calls) == [0, 1]  # each row once
  cases = {
    r"row 1 \(line 3\) has no field 'question'": '{"answer": "6"}',
    r"row 1 \(line 3\) has no field 'answer', which reward 'exact_match' reads": '{"question": "3+3?"}',
    r"row 1 \(line 3\) field 'tools' names unknown tool\(s\) \['nope'\]": '{"question": "q", "answer": "a", "tools": ["nope"]}',
  }
  for message, bad in cases.items():
    with pytest.raises(ValueError, match=re.escape(str(path)) + ": " + message):
      build(good, "", bad)
