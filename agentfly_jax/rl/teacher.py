"""`config.teacher`: the teacher of on-policy distillation (rl/core/distill.py), loaded beside the policy.

    --config.teacher.pretrained=/path/to/hf_teacher --config.loss.distill_weight=1.0    # distillation alone
    --config.loss.distill_weight=0.5                                                     # mixed with the reward

The teacher is an HF folder of any size or family whose tokenizer is the student's (the same token -> id map:
the teacher scores the student's token ids); its embedding may be padded past the tokenizer (Qwen2.5-7B's 152,064
rows over 1.5B's 151,936). It is sharded on the trainer's mesh by the same logical-axis rules and run by a jitted
program of its own (rl/core/prepare.make_teacher_logprobs) before each prepare.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import ClassVar

from agentfly_jax.rl.spec_section import Section, fail


@dataclasses.dataclass(frozen=True)
class TeacherSection(Section):
  NAME: ClassVar[str] = "teacher"
  pretrained: str = ""  # HF folder (config.json + safetensors + tokenizer.json); "" = no teacher
  dtype: str = ""  # its compute and param dtype; "" = model.dtype


def check_distill(spec) -> None:
  """loss.distill_weight > 0 needs teacher.pretrained and the reverse."""
  w, teacher = spec.loss.distill_weight, spec.teacher.pretrained
  if w > 0 and not teacher:
    fail("loss.distill_weight", w, "distillation needs a teacher: set config.teacher.pretrained to an HF folder")
  if teacher and not w:
    fail("teacher.pretrained", teacher, "a teacher is loaded for loss.distill_weight > 0, which is 0")
  if teacher and spec.teacher.dtype not in ("", "float32", "bfloat16", "float16"):
    fail("teacher.dtype", spec.teacher.dtype, "must be '', 'float32', 'bfloat16' or 'float16'")


def check_same_vocabulary(teacher_dir: str, student_tokenizer, where: str = "config.teacher.pretrained") -> int:
  """The teacher's embedding rows (its config.json vocab_size); ValueError naming `where` unless the teacher's
  tokenizer maps every token to the id the student's does and its embedding covers the tokenizer."""
  from agentfly_jax.agents import load_tokenizer

  for name in ("config.json", "tokenizer.json"):
    if not os.path.isfile(os.path.join(teacher_dir, name)):
      raise ValueError(f"{where}={teacher_dir!r}: no {name} (need an HF folder with its tokenizer)")
  theirs, ours = load_tokenizer(teacher_dir).get_vocab(), student_tokenizer.get_vocab()
  if theirs != ours:
    differ = sorted(set(theirs.items()) ^ set(ours.items()), key=lambda kv: kv[1])[:3]
    raise ValueError(
      f"{where}={teacher_dir!r}: the teacher's vocabulary differs from the student's ({len(theirs)} vs {len(ours)} "
      f"tokens; e.g. {differ}): the teacher scores the student's token ids, so both need one tokenizer"
    )
  with open(os.path.join(teacher_dir, "config.json")) as f:
    rows = int(json.load(f).get("vocab_size", 0))
  if rows < len(ours):
    raise ValueError(f"{where}={teacher_dir!r}: vocab_size {rows} is under the tokenizer's {len(ours)} tokens")
  return rows
