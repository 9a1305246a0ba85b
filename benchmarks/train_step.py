r"""Full training-step throughput and model FLOP utilisation, softmax vs relu/L (and the gate).

    python benchmarks/train_step.py [--models 'variant=Ti/16;variant=S/16'] [--batch 32]
    python benchmarks/train_step.py --config configs/repro/mnist_vit.py --image_size 28 \
        --channels 1 --models 'size=S,patch=4;size=S,patch=2' --attentions softmax,relu,relu2 \
        --gated --batch 32

The step is the trainer's own (`run.make_update_fn`: forward, backward, the recipe's optimizer
with clipping and decoupled weight decay), on random images, for `--config` (default the
paper's ImageNet-21k recipe `configs/vit_i21k.py`: 224 px, GAP head of 21,843 classes,
qk-layernorm) with each of `--models` (config arguments, ';'-separated) and `--attentions`.
`--gated` adds each pointwise attention with the paper's gate, and its cost (step time with the
gate / without). Each step is compiled with its config's `xla_compiler_options`, as the trainer
does; `--xla_options` compiles every step and matmul a second time with those XLA options added
('+xla' rows, timed in the same rounds), e.g. `xla_cpu_experimental_ynn_fusion_type=` (XLA:CPU's
YNNPACK fusions off).
MFU = model FLOPs per second / this machine's float32 matmul peak (the fastest of square
matmuls of 1024, 2048 and 4096, timed in turn with the steps): of the fastest step over the
fastest peak, and the median over rounds of each round's step over that round's peak.
Throughput vs softmax likewise: of the fastest steps, and per round (the two steps of a round
ran back to back, under the same load), as the median, quartiles and the share of rounds in
which the step beat softmax's. `--control` adds softmax compiled and timed a second time: its
ratio to softmax is the noise floor of the others (an A/A comparison). The targets are judged
on the per-round medians.
Model FLOPs are the analytic matmul count of `big_vision_relu.experiments.cost` (x3 for
forward + backward), the usual MFU convention; XLA's own count of the compiled step is printed
next to it.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import pathlib
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from big_vision_relu import config as cfg_lib
from big_vision_relu import optim
from big_vision_relu import run as run_lib
from big_vision_relu.experiments import cost, sweep

import common

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONTROL = "softmax control"  # --control: softmax compiled and timed again
XLA = " +xla"  # --xla_options: the name suffix of the steps and matmuls compiled with them


def recipe_config(config_path: str, model_args: str, attention: str, gated: bool,
                  attention_impl: str):
  """The config `config_path` with arguments `model_args`, `attention` and `gated`, and the
  attention implementation."""
  config = sweep.load_config_file(
      f"{ROOT / config_path}:{model_args},attention={attention},gated={gated}")
  if attention != "softmax":
    config.model.attention_impl = attention_impl
  return config


def make_step(config, batch_size: int, image_size: int, channels: int,
              compiler_options: dict[str, str] | None = None):
  """(compiled trainer update step, its (state, batch) arguments); `compiler_options`: XLA's."""
  config = cfg_lib.validate_train_config(config)  # what the trainer runs: defaults filled in
  model = run_lib.make_model(config)
  images = jax.random.normal(jax.random.PRNGKey(0),
                             (batch_size, image_size, image_size, channels))
  labels = jax.nn.one_hot(jnp.arange(batch_size) % config.num_classes, config.num_classes)
  params = jax.jit(model.init)(jax.random.PRNGKey(1), images[:1])["params"]
  tx, _ = optim.make_optimizer(config, params, total_steps=100_000)
  # The trainer's state layout (run.setup's init_state).
  state = dict(params=params, opt_state=jax.jit(tx.init)(params), step=jnp.zeros((), jnp.int32),
               rng=jax.random.PRNGKey(2), nonfinite_step=jnp.full((), -1, jnp.int32))
  batch = dict(image=images, labels=labels)
  compiled = common.compile_fn(run_lib.make_update_fn(model, tx, config), state, batch,
                               compiler_options=compiler_options)
  return compiled, (state, batch)


def op_times(compiled, args) -> dict[str, float]:
  """Seconds per kind of XLA op in one profiled call of `compiled` (jax.profiler's trace).

  Kinds: 'matmul' for dots, convolutions and fusions containing one; any other op by its name
  without the number (e.g. 'transpose_copy_fusion'). Ops of the two CPU threads can overlap, so
  the total may exceed the step's wall time.
  """
  hlo = compiled.as_text()
  bodies = dict(re.findall(r"^%(\S+) .*?\{\n(.*?)\n\}", hlo, re.M | re.S))
  calls = dict(re.findall(r"%(\S+) = .*?calls=%([\w.\-]+)", hlo))

  def kind(op: str) -> str:
    if re.search(r" (dot|convolution)\(", bodies.get(calls.get(op, ""), "")) or op.startswith(
        ("dot", "convolution")):
      return "matmul"
    return re.sub(r"\.\d+$", "", op)

  with tempfile.TemporaryDirectory() as trace_dir:
    jax.block_until_ready(compiled(*args))
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      jax.block_until_ready(compiled(*args))
    (trace,) = pathlib.Path(trace_dir).rglob("*.trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
  seconds = collections.Counter()
  for event in events:
    op = event.get("args", {}).get("hlo_op")
    if event.get("ph") == "X" and op:
      seconds[kind(op)] += event["dur"] / 1e6
  return dict(seconds)


def print_profile(name: str, times: dict[str, float], model_flops: float, top: int = 8) -> None:
  total = sum(times.values())
  print(f"\n{name}: {total:.2f} s of XLA ops; matmuls {100 * times['matmul'] / total:.0f}% at "
        f"{model_flops / times['matmul'] / 1e9:.1f} GFLOP/s (model FLOPs / matmul time)")
  common.print_table(("op kind", "s", "share"), [
      (k, f"{t:.3f}", f"{100 * t / total:.1f}%")
      for k, t in sorted(times.items(), key=lambda kv: -kv[1])[:top]])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default="configs/vit_i21k.py")
  parser.add_argument("--models", default="variant=Ti/16;variant=S/16",
                      help="';'-separated config arguments, one model each")
  parser.add_argument("--attentions", default="softmax,relu")
  parser.add_argument("--gated", action="store_true",
                      help="also time each pointwise attention with the gate")
  parser.add_argument("--attention_impl", default="dense",
                      help="implementation of the pointwise attentions (softmax is dense)")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--image_size", type=int, default=224)
  parser.add_argument("--channels", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=3,
                      help="timed calls per step (interleaved with the matmuls); fastest counts")
  parser.add_argument("--matmul_sizes", default=",".join(map(str, common.MATMUL_SIZES)),
                      help="square float32 matmuls timed for the peak (the MFU denominator)")
  parser.add_argument("--control", action="store_true",
                      help="also time a second, separately compiled softmax step: the noise "
                           "floor of the ratios vs softmax (an A/A comparison)")
  parser.add_argument("--xla_options", default="",
                      help="','-separated KEY=VALUE XLA options: every step and matmul is also "
                           "compiled with them ('+xla' rows)")
  parser.add_argument("--profile", action="store_true",
                      help="also print where each step's time goes, by kind of XLA op")
  args = parser.parse_args()
  print(f"jax {jax.__version__}, {jax.device_count()} device(s), {args.config}, batch "
        f"{args.batch}, {args.image_size} px", flush=True)

  xla_options = dict(item.split("=", 1) for item in args.xla_options.split(",") if item)
  builds = [("", None)] + ([(XLA, xla_options)] if xla_options else [])
  sizes = [int(n) for n in args.matmul_sizes.split(",")]
  runs, flops = {}, {}
  for suffix, options in builds:
    runs.update(common.matmul_runs(sizes, suffix, options))
  for model_args in args.models.split(";"):
    variants = [(attention, gated) for attention in args.attentions.split(",")
                for gated in ((False, True) if args.gated and attention != "softmax"
                              else (False,))]
    for attention, gated in variants + ([(CONTROL, False)] if args.control else []):
      config = recipe_config(args.config, model_args, attention.split()[0], gated,
                             args.attention_impl)
      for suffix, options in builds:
        compiled, step_args = make_step(config, args.batch, args.image_size, args.channels,
                                        {**dict(config.get("xla_compiler_options") or {}),
                                         **(options or {})})
        key = (model_args, attention + (" gated" if gated else "") + suffix)
        runs[key] = compiled, step_args
        flops[key] = (
            3 * args.batch * cost.forward_flops_per_image(
                dict(config.model), image_size=args.image_size, channels=args.channels,
                num_classes=config.num_classes),
            compiled.cost_analysis().get("flops", float("nan")))
        print(f"compiled {' '.join(key)}", flush=True)
  times = common.round_times(runs, rounds=args.rounds, max_seconds=args.rounds * 60.0)
  seconds = {name: min(t) for name, t in times.items()}
  rates = common.matmul_rates(seconds)
  peak = max(rates.values())
  # Each round's matmul peak, for an MFU per round (its step and its peak under the same load).
  round_peaks = [max(common.matmul_rates({name: times[name][i] for name in rates}).values())
                 for i in range(len(times[next(iter(rates))]))]

  def round_mfu(key, model_flops):
    return float(np.median([model_flops / t / p for t, p in zip(times[key], round_peaks,
                                                                 strict=True)]))

  def paired(baseline, key):
    if key not in times or baseline not in times:
      return None
    return common.paired_ratios(times[baseline], times[key])

  def vs_softmax(key):
    """Per round vs softmax compiled with the same XLA options."""
    model, attention = key
    suffix = XLA if attention.endswith(XLA) else ""
    return None if attention == "softmax" + suffix else paired((model, "softmax" + suffix), key)

  def cell(ratios):
    return "-" if ratios is None else (f"{ratios['median']:.2f}x [{ratios['q1']:.2f}, "
                                       f"{ratios['q3']:.2f}] {100 * ratios['faster']:.0f}%")

  rows = []
  for key, (model_flops, xla_flops) in flops.items():
    model, attention = key
    suffix = XLA if attention.endswith(XLA) else ""
    base = attention.removesuffix(XLA)
    step_s = seconds[key]
    ungated = seconds.get((model, base.removesuffix(" gated") + suffix))
    rows.append((model, attention, f"{step_s:.3f}", f"{args.batch / step_s:.2f}",
                 common.ratio(seconds.get((model, "softmax" + suffix)), step_s),
                 cell(vs_softmax(key)),
                 *([cell(paired((model, base), key)) if suffix else "-"] if xla_options else []),
                 common.ratio(step_s, ungated) if base.endswith(" gated") else "",
                 f"{model_flops / 1e9:.2f}", f"{xla_flops / 1e9:.2f}",
                 f"{model_flops / step_s / 1e9:.1f}", f"{100 * model_flops / step_s / peak:.1f}%",
                 f"{100 * round_mfu(key, model_flops):.1f}%"))
  print(f"\n{len(round_peaks)} rounds. float32 matmuls [n, n] x [n, n]: " + ", ".join(
      f"{name.removeprefix('matmul ')}: {rate / 1e9:.1f} GFLOP/s" for name, rate in rates.items())
      + f"; peak (the fastest) {peak / 1e9:.1f} GFLOP/s\n")
  common.print_table(("model", "attention", "s/step", "img/s", "throughput vs softmax",
                      "per round vs softmax: median [quartiles] rounds faster",
                      *(["per round vs default XLA"] if xla_options else []),
                      "gate cost (time x)", "model GFLOP/step", "XLA GFLOP/step", "GFLOP/s",
                      "MFU", "MFU per round (median)"), rows)
  print("\nTargets (the per-round medians):")
  for (model, attention), (model_flops, _) in flops.items():
    base = attention.removesuffix(XLA)
    if base.endswith(" gated") or base == CONTROL:
      continue
    suffix = attention.removeprefix(base)
    ratios, control = vs_softmax((model, attention)), vs_softmax((model, CONTROL + suffix))
    if ratios is not None:
      floor = ("" if control is None else f"; the control (softmax again) gives "
               f"{control['median']:.2f}x [{control['q1']:.2f}, {control['q3']:.2f}]")
      print(f"  {model} {attention} throughput {ratios['median']:.2f}x softmax (target >= 1): "
            f"{'met' if ratios['median'] >= 1 else 'NOT met'}{floor}")
    if model.endswith("S/16"):
      mfu = round_mfu((model, attention), model_flops)
      print(f"  {model} {attention} MFU {100 * mfu:.1f}% (target >= 60%): "
            f"{'met' if mfu >= 0.6 else 'NOT met'}")
  if args.profile:
    for key, (model_flops, _) in flops.items():
      print_profile(" ".join(key), op_times(*runs[key]), model_flops)


if __name__ == "__main__":
  main()
