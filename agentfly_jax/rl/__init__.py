"""agentfly_jax.rl: the trainer's host loop (spec, setup, stages, trainer, batching) over the pure
device math of agentfly_jax.rl.core (advantage estimators, losses, train step, prepare).

    from agentfly_jax.rl import advantages, losses       # = agentfly_jax.rl.core.*
    from agentfly_jax.rl.loop import train              # train(spec, build_run(spec, workdir), workdir)
    from agentfly_jax.rl.trainer import Trainer         # the same behind one object (notebooks)
"""

from agentfly_jax.rl.core import advantages, losses

__all__ = ["advantages", "losses"]
