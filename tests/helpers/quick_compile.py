"""Test programs compiled for compile time: XLA's CPU backend at optimisation level 0.

A test's own jitted helper (a model run outside the engine, a kernel in interpret mode) runs
a few times on tiny shapes, so LLVM's optimisation passes cost more than they save: level 0
takes about half the compile time. The HLO and its float semantics are unchanged (no fast
math either way); only the machine code is less tuned. The engine's programs keep XLA's
defaults.
"""

import functools

import jax

QUICK_COMPILE = {"xla_backend_optimization_level": 0}
quick_jit = functools.partial(jax.jit, compiler_options=QUICK_COMPILE)
"""`jax.jit` with QUICK_COMPILE, used like it (also as `functools.partial(quick_jit, ...)`)."""
