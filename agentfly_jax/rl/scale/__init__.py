"""The scale tooling of a run, beside the loop (rl/) and the device math (rl/core/): every program
compiled for a TPU / GPU topology with no device (aot.py: inputs + report, aot_programs.py: the
abstract run + one compile function per program, aot_gpu.py: XLA's GPU target config), the JAX /
vLLM memory split on one GPU (memory_plan.py), and JAX's persistent compilation cache
(compile_cache.py). Import the modules themselves (`from agentfly_jax.rl.scale import aot`): this
package imports nothing, so the loop pays for none of it."""
