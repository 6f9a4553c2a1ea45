"""Multi-hop QA, brief prompt, trained on the 2-hop questions only: task `multihop_qa_brief`
(tasks/multihop_qa_brief.py: its tools, reward, prompt, demos and held-out rows) whose training
rows (SFT demos and RL) are the training split's 2-hop bridge and comparison questions, the kinds
of the held-out split; so a chain's reward cannot come from answering after one retrieval."""

from agentfly_jax.tasks.multihop_qa_brief import (  # noqa: F401
  REWARD,
  REWARD_ONLY_FIELDS,
  SYSTEM_PROMPT,
  TOOLS,
  make_agent,
  make_eval_rows,
  make_test_rows,
  scripted_response,
  tokenizer_corpus,
)
from agentfly_jax.tasks.multihop_qa_brief import make_two_hop_rows as make_rows  # noqa: F401
