"""What a lookup warm start can copy, per split: the key into its tool call, and the code out of the
observation into its answer (an independent check in PyTorch: the HF folder loaded by transformers).

  .venv/bin/python experiments/lookup_copy_probe.py --model=experiments/results/lookup_warmstart

- key copy: the prompt of a row and the call up to `"key": "`, then greedy tokens; right when they
  spell the row's key and close the string.
- observation copy: the row's call and an observation showing *another* code word than the key's
  (so a code remembered from training is told apart from one read off the page); counts the answers
  that say the shown word and those that say the key's true code.

Writes a JSON line per split to stdout (and `--out` when given).
"""

import json
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402

_MODEL = flags.DEFINE_string("model", "experiments/results/lookup_warmstart", "HF folder of the policy.")
_KEYS = flags.DEFINE_integer("keys", 32, "Keys per split (the first of each split's key list).")
_OUT = flags.DEFINE_string("out", "", "Also write the results here (JSON).")


def _greedy(model, tok, text: str, n: int) -> str:
  import torch

  ids = tok(text, return_tensors="pt").input_ids
  with torch.no_grad():
    out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
  return tok.decode(out[0, ids.shape[1] :])


def probe_split(model, tok, keys) -> dict:
  from agentfly_jax.tasks import lookup

  def messages(key):
    return [
      {"role": "system", "content": lookup.SYSTEM_PROMPT},
      {"role": "user", "content": f'Find the code of key "{key}".'},
    ]

  key_right = shown = recalled = 0
  for i, key in enumerate(keys):
    prompt = tok.apply_chat_template(messages(key), tokenize=False, add_generation_prompt=True)
    call_prefix = lookup.tool_call_text(key).split(f'"{key}"')[0] + '"'
    key_right += _greedy(model, tok, prompt + call_prefix, 8).startswith(f'{key}"')
    other = lookup.WORDS[(lookup.WORDS.index(lookup.secret_code(key)) + 1 + i) % len(lookup.WORDS)]
    after_obs = messages(key) + [
      {"role": "assistant", "content": lookup.tool_call_text(key)},
      {"role": "tool", "content": lookup.answer_text(other)},
    ]
    answer = lookup.extract_answer(
      _greedy(model, tok, tok.apply_chat_template(after_obs, tokenize=False, add_generation_prompt=True), 8)
    )
    shown += answer == other
    recalled += answer == lookup.secret_code(key)
  n = len(keys)
  return {
    "keys": n,
    "key_copied": key_right / n,
    "answer_says_shown_code": shown / n,
    "answer_says_true_code": recalled / n,
  }


def main(argv):
  del argv
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer

  from agentfly_jax.tasks import lookup

  tok = AutoTokenizer.from_pretrained(_MODEL.value)
  model = AutoModelForCausalLM.from_pretrained(_MODEL.value, torch_dtype=torch.float32).eval()
  results = {"model": _MODEL.value}
  for split in ("train", "dev", "test"):
    results[split] = probe_split(model, tok, lookup.SPLIT_KEYS[split][: _KEYS.value])
    print(json.dumps({"split": split, **results[split]}), flush=True)
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(results, f, indent=2)


if __name__ == "__main__":
  app.run(main)
