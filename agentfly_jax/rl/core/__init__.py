"""agentfly_jax.rl.core: the RL math that runs on the device — pure functions, jitted, no host
state: advantage estimators and losses (registered by name), the optimizer and train state, the
train / SFT step, the prepare pass. The host loop (agentfly_jax.rl: trainer, stages, setup,
batching) calls into it; nothing here imports the host loop (tests/house/test_import_graph.py).

    from agentfly_jax.rl.core import advantages, losses, train_step
"""

from agentfly_jax.rl.core import advantages, losses
from agentfly_jax.rl.core import turn_advantages  # noqa: F401 (registers the turn-level estimators turn_gae, gigpo)

__all__ = ["advantages", "losses"]
