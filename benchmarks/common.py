"""Shared measurement helpers of the benchmarks (timing, compiled memory, matmul peak, tables).

Every benchmark compares against baselines measured in the same process, so the ratios it
prints are not skewed by a different machine or a different load; absolute numbers on a shared
CPU are noisy, which is why the timings are the MINIMUM over repeats (the run least disturbed by
other processes), not the mean, and why two runs are also compared round by round
(`paired_ratios`): calls made back to back share the machine's load of the moment.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

MIB = 2.0 ** 20


def compile_fn(fn: Callable[..., Any], *args: Any, **jit_kw: Any) -> jax.stages.Compiled:
  """`jax.jit(fn, **jit_kw)` lowered and compiled for `args` (compiling allocates nothing)."""
  return jax.jit(fn, **jit_kw).lower(*args).compile()


def round_times(runs: Mapping[str, tuple[Callable[..., Any], Sequence[Any]]], rounds: int = 3,
                max_seconds: float = 120.0) -> dict[str, list[float]]:
  """{name: seconds of each of its timed calls} for `runs` {name: (compiled, args)}.

  Each run is called once to warm up, then the runs take turns, one call each per round (in
  reverse order every other round), so a change in the machine's load hits every run alike
  instead of whichever ran during it, and
  call i of two runs can be compared as a pair (`paired_ratios`). Rounds stop after
  `max_seconds` (at least one round always runs).
  """
  for fn, args in runs.values():
    jax.block_until_ready(fn(*args))
  times: dict[str, list[float]] = {name: [] for name in runs}
  started = time.perf_counter()
  for i in range(rounds):
    # Every other round runs in reverse order, so that no run always follows the same one
    # (a call can be slowed by its predecessor's memory traffic or frequency state).
    for name in list(runs) if i % 2 == 0 else list(runs)[::-1]:
      fn, args = runs[name]
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - start)
    if time.perf_counter() - started > max_seconds:
      break
  return times


def min_times(runs: Mapping[str, tuple[Callable[..., Any], Sequence[Any]]], rounds: int = 3,
              max_seconds: float = 120.0) -> dict[str, float]:
  """{name: seconds of its fastest call}: the call least disturbed by other processes."""
  return {name: min(t) for name, t in round_times(runs, rounds, max_seconds).items()}


def paired_ratios(baseline: Sequence[float], other: Sequence[float]) -> dict[str, float]:
  """Speed of `other` relative to `baseline` (baseline time / other time, > 1 = faster), per
  round of `round_times`: the two calls of a round ran back to back, under the same load.
  Returns the median and quartiles over rounds and the fraction of rounds `other` was faster.
  """
  ratios = np.asarray(baseline) / np.asarray(other)
  q1, median, q3 = np.quantile(ratios, [0.25, 0.5, 0.75])
  return {"median": float(median), "q1": float(q1), "q3": float(q3),
          "faster": float(np.mean(ratios > 1.0))}


def memory_mib(compiled: jax.stages.Compiled) -> dict[str, float]:
  """XLA's buffer assignment of a compiled executable, in MiB.

  temp: the preallocated scratch of intermediates, sized by XLA's heap simulation as the most
    bytes simultaneously live (the working memory beyond inputs and outputs);
  peak: arguments + outputs + temp - buffers aliased between them: the most device memory the
    executable needs while it runs. Neither includes the generated code.
  """
  stats = compiled.memory_analysis()
  temp = stats.temp_size_in_bytes
  peak = (stats.argument_size_in_bytes + stats.output_size_in_bytes + temp
          - stats.alias_size_in_bytes)
  return {"temp": temp / MIB, "peak": peak / MIB}


MATMUL_SIZES = (1024, 2048, 4096)


def matmul_runs(sizes: Sequence[int] = MATMUL_SIZES, suffix: str = "",
                compiler_options: Mapping[str, Any] | None = None
                ) -> dict[str, tuple[Any, tuple]]:
  """{name: (compiled, args)} of square float32 `[n, n] x [n, n]` matmuls ('matmul {n}{suffix}',
  compiled with XLA's `compiler_options`), timed next to the benchmark's own runs (see
  `matmul_rates`)."""
  runs = {}
  for n in sizes:
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    runs[f"matmul {n}{suffix}"] = (
        compile_fn(lambda a, b: a @ b, a, b, compiler_options=compiler_options), (a, b))
  return runs


def matmul_rates(seconds: Mapping[Any, float]) -> dict[str, float]:
  """{name: FLOP/s} of the `matmul_runs` among `seconds` (from `min_times`); the fastest is
  this machine's measured matmul peak, the denominator of the model FLOP utilisation."""
  return {name: 2 * int(name.split()[1]) ** 3 / t for name, t in seconds.items()
          if isinstance(name, str) and name.startswith("matmul ")}


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
  """A Markdown table (pasted as is into docs/benchmarks.md)."""
  cells = [[str(c) for c in row] for row in rows]
  widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
  for values in (headers, ["-" * w for w in widths], *cells):
    print("| " + " | ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)) + " |")


def ratio(value: float | None, baseline: float | None) -> str:
  """'0.42x', or '-' when either side was not measured."""
  return "-" if value is None or baseline is None else f"{value / baseline:.2f}x"
