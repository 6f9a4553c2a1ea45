"""Writes the generated multi-hop knowledge base: the corpus JSONL and the question rows.

  python experiments/make_multihop_kb.py --out_dir=runs/kb [--seed=0] [--scale=1.0]

writes OUT_DIR/corpus.jsonl ({"id", "title", "text"} per line, for
`--env-opt retrieval.corpus=...`), OUT_DIR/train.json and OUT_DIR/test.json (AgentFly JSON rows:
a list of {"question", "answer": [gold, *aliases], "type", "hops", "supporting_titles",
"entity"}). `--ship` rewrites the corpus the `retrieval` env serves by default
(envservers/data/multihop_kb.jsonl.gz; seed 0, scale 1; a test checks it matches).
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags

from agentfly_jax.tasks.multihop_kb import generate_kb, write_corpus

_OUT_DIR = flags.DEFINE_string("out_dir", "runs/multihop_kb", "Output folder.")
_SEED = flags.DEFINE_integer("seed", 0, "Generator seed.")
_SCALE = flags.DEFINE_float("scale", 1.0, "Entity-count multiplier (1.0: ~5,200 passages).")
_SHIP = flags.DEFINE_bool("ship", False, "Rewrite envservers/data/multihop_kb.jsonl.gz.")
SHIPPED = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "envservers", "data", "multihop_kb.jsonl.gz"
)


def main(argv):
  del argv
  start = time.perf_counter()
  kb = generate_kb(seed=_SEED.value, scale=_SCALE.value)
  os.makedirs(_OUT_DIR.value, exist_ok=True)
  write_corpus(kb.passages, os.path.join(_OUT_DIR.value, "corpus.jsonl"))
  for split, rows in kb.questions.items():
    with open(os.path.join(_OUT_DIR.value, f"{split}.json"), "w") as f:
      json.dump(rows, f, indent=1)
  if _SHIP.value:
    write_corpus(kb.passages, SHIPPED)
  print(
    f"{len(kb.passages)} passages, {len(kb.questions['train'])} train / "
    f"{len(kb.questions['test'])} test questions in {time.perf_counter() - start:.1f} s "
    f"-> {_OUT_DIR.value}"
  )


if __name__ == "__main__":
  app.run(main)
