r"""Attention op forward + backward: time and peak memory vs sequence length.

    python benchmarks/attention_op.py [--lengths 196,1024,4096,8192,16384] [--heads 6]

One `[1, L, heads, 64]` self-attention (S/16's heads) through `jax.vjp`: the output and the
gradients for q, k and v. Implementations: relu/L dense (the baseline of the ratios), relu/L
chunked, softmax dense (our XLA path) and `jax.nn.dot_product_attention` (XLA). Memory is XLA's
buffer assignment of the compiled executable (`common.memory_mib`), read before running, so an
executable that would not fit in `--max_peak_gib` is reported and skipped instead of run.
"""
from __future__ import annotations

import argparse
import functools

import jax

from big_vision_relu.models import attention as attn
from big_vision_relu.models import blockwise

import common

HEAD_DIM = 64


def implementations(block_size: int) -> dict:
  relu = dict(activation="relu", seqlen_alpha=1.0)
  return {
      "relu/L dense": functools.partial(attn.dot_product_attention, **relu),
      "relu/L chunked": functools.partial(blockwise.chunked_pointwise_attention,
                                          attn.AttentionOptions(**relu, impl="chunked",
                                                                block_size=block_size)),
      "softmax dense (XLA)": functools.partial(attn.dot_product_attention, activation="softmax"),
      "jax.nn.dot_product_attention": functools.partial(jax.nn.dot_product_attention,
                                                        implementation="xla"),
  }


def forward_backward(fn):
  """(q, k, v, d_out) -> (output, (dq, dk, dv))."""
  def step(q, k, v, d_out):
    out, vjp = jax.vjp(fn, q, k, v)
    return out, vjp(d_out)
  return step


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--lengths", default="196,1024,4096,8192,16384")
  parser.add_argument("--heads", type=int, default=6)
  parser.add_argument("--block_size", type=int, default=512)
  parser.add_argument("--rounds", type=int, default=3,
                      help="timed calls per implementation (interleaved); the fastest counts")
  parser.add_argument("--max_peak_gib", type=float, default=8.0,
                      help="skip running executables whose compiled peak memory exceeds this")
  args = parser.parse_args()
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {jax.device_count()} device(s); "
        f"[1, L, {args.heads}, {HEAD_DIM}] float32, chunked block_size {args.block_size}")

  impls = implementations(args.block_size)
  measured, statuses = {}, {}  # (L, name) -> (seconds or None, memory MiB); -> status
  for length in (int(x) for x in args.lengths.split(",")):
    keys = jax.random.split(jax.random.PRNGKey(length), 4)
    inputs = [jax.random.normal(k, (1, length, args.heads, HEAD_DIM)) for k in keys]
    runs = {}
    for name, fn in impls.items():
      compiled = common.compile_fn(forward_backward(fn), *inputs)
      memory = common.memory_mib(compiled)
      measured[length, name] = None, memory
      if memory["peak"] > args.max_peak_gib * 1024:
        statuses[length, name] = (f"skipped: peak {memory['peak'] / 1024:.1f} GiB > "
                                  f"--max_peak_gib {args.max_peak_gib}")
      else:
        runs[name] = compiled, inputs
        statuses[length, name] = "ran"
    for name, seconds in common.min_times(runs, rounds=args.rounds).items():
      measured[length, name] = seconds, measured[length, name][1]
    del runs
    for name in impls:
      print(f"L={length} {name}: {measured[length, name]}", flush=True)

  rows = []
  for (length, name), (seconds, memory) in measured.items():
    dense_s, dense_mem = measured[length, "relu/L dense"]
    softmax_s = measured[length, "softmax dense (XLA)"][0]
    rows.append((length, name, "-" if seconds is None else f"{seconds:.4f}",
                 common.ratio(seconds, dense_s), common.ratio(seconds, softmax_s),
                 f"{memory['temp']:.1f}", f"{memory['peak']:.1f}",
                 common.ratio(memory["peak"], dense_mem["peak"]), statuses[length, name]))
  print()
  common.print_table(("L", "implementation", "fwd+bwd s", "time vs relu/L dense",
                      "time vs softmax dense", "temp MiB", "peak MiB", "peak vs relu/L dense",
                      "status"), rows)

  print("\nTargets (chunked relu/L vs dense relu/L):")
  lengths = sorted({length for length, _ in measured})
  memory_lengths = [n for n in lengths if n >= 8192] or lengths[-1:]
  for n in memory_lengths[:1]:
    r = measured[n, "relu/L chunked"][1]["peak"] / measured[n, "relu/L dense"][1]["peak"]
    print(f"  peak memory at L={n}: {r:.4f} of dense (target <= 0.125): "
          f"{'met' if r <= 0.125 else 'NOT met'}")
  times = {n: measured[n, "relu/L chunked"][0] / measured[n, "relu/L dense"][0]
           for n in lengths if measured[n, "relu/L dense"][0] is not None}
  worst = max(times, key=times.get)
  print(f"  time where dense ran (L={', '.join(map(str, times))}): worst {times[worst]:.2f}x at "
        f"L={worst} (target <= 1.25x): {'met' if times[worst] <= 1.25 else 'NOT met'}")


if __name__ == "__main__":
  main()
