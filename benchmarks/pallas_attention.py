r"""Fused pointwise attention: `attention_impl='pallas'` against XLA and the best softmax kernels.

    PYTHONPATH=. python3 benchmarks/pallas_attention.py                  # the op, on a GPU or TPU
    PYTHONPATH=. python3 benchmarks/pallas_attention.py --tables train   # ViT training steps
    PYTHONPATH=. python3 benchmarks/pallas_attention.py --dry --tables op,errors,memory,train

The op: a `[b, L, h, 64]` bf16 self-attention, its forward alone and its forward + backward
(`jax.vjp`: the output and dq, dk, dv), for L in `--lengths`, with b chosen so that every L does
the same work (b h L^2 = `--pairs`: b = 6917, 436, 16, 1 at L = 197, 785, 4096, 16384 with 6
heads), enough programs to fill the device. Implementations, compiled first and then timed in
alternating rounds (`common.round_times`), forward and forward + backward in the same rounds:
  pallas relu/L     our fused Pallas kernels (Triton on a GPU, Mosaic on a TPU), `--block_size`;
  dense relu/L      XLA: the `[b, h, L, L]` weights materialised (the model's dense path);
  chunked relu/L    our blockwise XLA path, `--chunk_size` blocks;
  softmax ...       the best softmax kernel of the platform (`--softmax`, by default cudnn on a
                    GPU, splash on a TPU): cuDNN's flash attention through
                    `jax.nn.dot_product_attention(implementation='cudnn')` with odd lengths
                    zero-padded to a multiple of `--cudnn_multiple` (2) and masked by sequence
                    lengths (`cudnn_attention.padded_softmax`, what attention_impl='cudnn' runs),
                    or jax's splash attention (Pallas TPU) with lengths padded to a multiple of
                    128 in a segment of their own; `xla`: the same padding as cudnn, by XLA.
TFLOP/s use FlashAttention's convention: forward 4 b h L^2 d (q.k and w.v), backward 2.5x the
forward (the scores recomputed, dv, dw, dq and dk), so forward + backward counts 3.5 x 4 b h L^2 d
for every implementation (whatever it computes), and TFLOP/s ratios are inverse time ratios.
Speed ratios are per round (the calls of a round ran back to back): median [quartiles].

Errors (b = 1; every activation at the first L, relu/L at the others): the output and dq, dk,
dv of pallas and of a naive bf16 dense attention (scores and weights in bf16,
`float32_scores=False`), each against float32 (the chunked path at HIGHEST precision on the same
bf16-rounded inputs, upcast) as the largest absolute error; the rule (FlashSigmoid's and
FlashAttention's tests): pallas's error <= 2x the naive one.
Memory: XLA's buffer assignment of each compiled forward + backward at b = 1 (compile only,
`common.memory_mib`): pallas's and chunked's grow as O(L), dense's as O(L^2). Executables whose
peak exceeds `--max_peak_gib` are reported and not run.
Train (`--tables train`): one training step (forward, backward, AdamW) of each `--train_models`
(S/16 and S/8 at 224 px by default: L = 197 and 785), class token, bf16 matmuls, on random
images, with softmax (dense, and on a GPU attention_impl='cudnn') and relu/L (dense, chunked,
pallas), timed in alternating rounds; pallas's speed is given against the faster softmax of the
run (per round). Each model's table is printed as soon as it is measured. `--tables` picks the
tables (default: op, errors, memory), so that each command fits the GPU machine's 10 minutes.

Imports nothing of TensorFlow, TFDS, clu or ml_collections (the GPU machine has none): the model
is `big_vision_relu.models.vit.Model`, the optimizer optax's. `--dry` runs everything on CPU (the
Pallas interpreter; splash in its interpreter with `--softmax splash`) at tiny sizes, one round:
what tests/test_benchmarks.py runs.
"""
from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from big_vision_relu.models import attention as attn
from big_vision_relu.models import blockwise, cudnn_attention, vit
from big_vision_relu.models.attention import AttentionOptions
from big_vision_relu.models.pallas_attention import pallas_pointwise_attention

import common
from attention_op import forward_backward

HEAD_DIM = 64
FWD_BWD_FLOPS = 3.5  # forward + backward, in forwards (FlashAttention's convention)
PALLAS, DENSE, CHUNKED = "pallas relu/L", "dense relu/L", "chunked relu/L"
ERROR_NAMES = ("output", "dq", "dk", "dv")
TABLES = ("op", "errors", "memory", "train")
SOFTMAX_KERNELS = ("cudnn", "splash", "xla")
SPLASH_MULTIPLE = 128  # splash attention's lengths: whole tiles of 128


def splash_softmax(query: jax.Array, key: jax.Array, value: jax.Array, *,
                   interpret: bool = False) -> jax.Array:
  """jax's splash attention (Pallas TPU, softmax) on `[B, L, heads, d]` self-attention: the
  length zero-padded to a multiple of 128, the padded tokens in a segment of their own (so no
  real query sees them), the largest tiles of 512, 256 or 128 that divide it, the fused
  backward kernel."""
  # On a TPU only (or interpreted): imported here so that GPU and CPU runs need none of it.
  from jax.experimental.pallas.ops.tpu.splash_attention import (  # noqa: PLC0415
      splash_attention_kernel as splash, splash_attention_mask as masks)
  batch, length, heads, head_dim = query.shape
  padded = -(-length // SPLASH_MULTIPLE) * SPLASH_MULTIPLE
  block = next(b for b in (512, 256, 128) if padded % b == 0)
  sizes = splash.BlockSizes(block_q=block, block_kv=block, block_q_dkv=block, block_kv_dkv=block,
                            use_fused_bwd_kernel=True)
  kernel = splash.make_splash_mha(masks.MultiHeadMask([masks.FullMask((padded, padded))] * heads),
                                  block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                  interpret=interpret)
  ids = (jnp.arange(padded) >= length).astype(jnp.int32)
  to_heads = lambda x: jnp.pad(  # noqa: E731  [B, L, h, d] -> [B, h, padded, d]
      jnp.swapaxes(x, 1, 2), ((0, 0), (0, 0), (0, padded - length), (0, 0)))
  out = jax.vmap(kernel, in_axes=(0, 0, 0, None))(
      to_heads(attn.scaled_query(query)), to_heads(key), to_heads(value),
      splash.SegmentIds(q=ids, kv=ids))
  return jnp.swapaxes(out, 1, 2)[:, :length]


def softmax_kernel(name: str, cudnn_multiple: int, interpret: bool) -> Callable:
  """The softmax baseline `name` (one of SOFTMAX_KERNELS) as attention(q, k, v)."""
  if name == "splash":
    return functools.partial(splash_softmax, interpret=interpret)
  return functools.partial(cudnn_attention.padded_softmax, implementation=name,
                           multiple=cudnn_multiple)


def implementations(block_size: int, chunk_size: int, softmax: Callable,
                    softmax_name: str) -> dict[str, Callable]:
  """{name: attention(q, k, v)} of the op table."""
  relu = dict(activation="relu", seqlen_alpha=1.0)
  return {
      PALLAS: functools.partial(pallas_pointwise_attention, AttentionOptions(
          **relu, impl="pallas", block_size=block_size)),
      DENSE: functools.partial(attn.dot_product_attention, **relu),
      CHUNKED: functools.partial(blockwise.chunked_pointwise_attention, AttentionOptions(
          **relu, impl="chunked", block_size=chunk_size)),
      f"softmax {softmax_name}": softmax,
  }


def random_inputs(seed: int, shape: Sequence[int], dtype: Any) -> list[jax.Array]:
  """q, k, v and an output cotangent, normal (never zeros: they hide unwritten outputs)."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  return [jax.random.normal(key, shape, dtype) for key in keys]


def compile_or_skip(fn: Callable, args: Sequence[Any], max_peak_gib: float
                    ) -> tuple[jax.stages.Compiled | None, dict[str, float] | None, str]:
  """(compiled, memory MiB, status): status 'ran' when it may run, else why not (a compile
  failure is reported, not raised, so one implementation cannot stop the others)."""
  try:
    compiled = common.compile_fn(fn, *args)
  except Exception as e:  # noqa: BLE001 (any compiler error is a result to report)
    return None, None, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
  memory = common.memory_mib(compiled)
  if memory["peak"] > max_peak_gib * 1024:
    return None, memory, f"skipped: peak {memory['peak'] / 1024:.1f} GiB > --max_peak_gib"
  return compiled, memory, "ran"


def speed(times: dict[Any, list[float]], name: Any, baseline: Any) -> str:
  """'1.23x [1.20, 1.25]': baseline time / name's time per round, median [quartiles] (runs are
  named as in `times`: a name, or (name, pass))."""
  if name not in times or baseline not in times:
    return "-"
  r = common.paired_ratios(times[baseline], times[name])
  return f"{r['median']:.2f}x [{r['q1']:.2f}, {r['q3']:.2f}]"


def op_table(impls: dict[str, Callable], lengths: Sequence[int], heads: int, pairs: float,
             rounds: int, max_peak_gib: float) -> None:
  """Forward and forward + backward times of `impls` at each length, b h L^2 = `pairs`, all in
  the same alternating rounds."""
  softmax = next(name for name in impls if name.startswith("softmax"))
  passes = {"fwd": lambda fn: lambda q, k, v, d_out: fn(q, k, v), "fwd+bwd": forward_backward}
  rows = []
  for length in lengths:
    batch = max(1, round(pairs / (heads * length ** 2)))
    inputs = random_inputs(length, (batch, length, heads, HEAD_DIM), jnp.bfloat16)
    runs, statuses = {}, {}
    for name, fn in impls.items():
      for pass_name, make in passes.items():
        compiled, _, statuses[name, pass_name] = compile_or_skip(make(fn), inputs, max_peak_gib)
        if compiled is not None:
          runs[name, pass_name] = compiled, inputs
    times = common.round_times(runs, rounds=rounds)
    forward_flops = 4 * batch * heads * length ** 2 * HEAD_DIM
    for name in impls:
      cells = []
      for pass_name, flops in (("fwd", forward_flops), ("fwd+bwd", FWD_BWD_FLOPS * forward_flops)):
        seconds = min(times[name, pass_name]) if (name, pass_name) in times else None
        cells += ["-" if seconds is None else f"{1e3 * seconds:.3f}",
                  "-" if seconds is None else f"{flops / seconds / 1e12:.1f}",
                  speed(times, (name, pass_name), (softmax, pass_name))]
      status = statuses[name, "fwd"]
      if statuses[name, "fwd+bwd"] != status:
        status = f"fwd {status}; fwd+bwd {statuses[name, 'fwd+bwd']}"
      rows.append((length, f"{batch} x {heads}", name, *cells,
                   speed(times, (name, "fwd+bwd"), (DENSE, "fwd+bwd")), status))
    print(f"L={length}: {len(runs)} of {2 * len(impls)} ran", flush=True)
  print(f"\nForward alone and forward + backward, bf16, head dim {HEAD_DIM}; TFLOP/s = 4 b h L^2 d "
        f"(forward), {FWD_BWD_FLOPS} x that (forward + backward) / fastest time; speed = other's "
        "time / this one's, per round: median [quartiles].")
  common.print_table(("L", "b x h", "implementation", "fwd ms", "fwd TFLOP/s",
                      f"fwd speed vs {softmax}", "fwd+bwd ms", "fwd+bwd TFLOP/s",
                      f"fwd+bwd speed vs {softmax}", f"fwd+bwd speed vs {DENSE}", "status"), rows)


def error_table(cases: Sequence[tuple[str, int]], heads: int, block_size: int,
                max_peak_gib: float) -> None:
  """Largest absolute errors of pallas and of naive bf16 dense attention vs float32, for each
  (activation, L) of `cases` (alpha 1)."""
  rows, verdicts = [], []
  for activation, length in cases:
    kw = dict(activation=activation, seqlen_alpha=1.0)
    inputs = random_inputs(length + 1, (1, length, heads, HEAD_DIM), jnp.bfloat16)
    results = {}
    for name, fn, args in (
        (PALLAS, functools.partial(pallas_pointwise_attention, AttentionOptions(
            **kw, impl="pallas", block_size=block_size)), inputs),
        ("naive bf16", functools.partial(attn.dot_product_attention, **kw, float32_scores=False),
         inputs),
        ("float32", functools.partial(blockwise.chunked_pointwise_attention, AttentionOptions(
            **kw, impl="chunked", precision=lax.Precision.HIGHEST)),
         [x.astype(jnp.float32) for x in inputs])):
      compiled, _, status = compile_or_skip(forward_backward(fn), args, max_peak_gib)
      if compiled is None:
        print(f"{activation} L={length} {name}: {status}")
        break
      out, grads = compiled(*args)
      results[name] = [np.asarray(x, np.float32) for x in (out, *grads)]
    else:
      want = results["float32"]
      for i, quantity in enumerate(ERROR_NAMES):
        err = {name: float(np.abs(results[name][i] - want[i]).max())
               for name in (PALLAS, "naive bf16")}
        ok = err[PALLAS] <= 2 * err["naive bf16"]
        verdicts.append(ok)
        rows.append((activation, length, quantity, f"{err[PALLAS]:.3e}",
                     f"{err['naive bf16']:.3e}", f"{err[PALLAS] / err['naive bf16']:.2f}",
                     "met" if ok else "NOT met"))
  print("\nbf16 error vs float32 (largest absolute difference), b = 1, alpha 1; rule: pallas <= "
        "2x naive")
  common.print_table(("activation", "L", "quantity", "pallas error", "naive bf16 error", "ratio",
                      "rule"), rows)
  print(f"rule met in {sum(verdicts)} of {len(verdicts)} cases")


def memory_table(impls: dict[str, Callable], lengths: Sequence[int], heads: int) -> None:
  """Compiled memory of forward + backward at b = 1 (nothing runs)."""
  rows = []
  for length in lengths:
    args = [jax.ShapeDtypeStruct((1, length, heads, HEAD_DIM), jnp.bfloat16)] * 4
    for name, fn in impls.items():
      _, memory, status = compile_or_skip(forward_backward(fn), args, max_peak_gib=float("inf"))
      rows.append((length, name, *(("-", "-", "-") if memory is None else (
          f"{memory['temp']:.2f}", f"{memory['peak']:.2f}",
          f"{memory['peak'] * 1024 / length:.2f}")), status))
  print(f"\nCompiled memory of forward + backward, [1, L, {heads}, {HEAD_DIM}] bf16 (XLA's buffer "
        "assignment): O(L) memory = a constant peak per token")
  common.print_table(("L", "implementation", "temp MiB", "peak MiB", "peak KiB per token",
                      "status"), rows)


def train_step_table(models: Sequence[tuple[str, int]], batch: int, block_size: int,
                     chunk_size: int, rounds: int, max_peak_gib: float, cudnn: bool) -> None:
  """One AdamW training step of each model with softmax and relu/L attentions; `cudnn`: also
  softmax by cuDNN (attention_impl='cudnn', a GPU only)."""
  attentions = {"softmax dense": ("softmax", "dense", None)}
  if cudnn:
    attentions["softmax cudnn"] = ("softmax", "cudnn", None)
  attentions |= {DENSE: ("relu", "dense", None), CHUNKED: ("relu", "chunked", chunk_size),
                 PALLAS: ("relu", "pallas", block_size)}
  tx = optax.adamw(1e-3, weight_decay=1e-4)
  for variant, image_size in models:
    rows = []
    images = jax.random.normal(jax.random.PRNGKey(0), (batch, image_size, image_size, 3))
    labels = jax.nn.one_hot(jnp.arange(batch) % 1000, 1000)
    runs, statuses = {}, {}
    for name, (attention, impl, block) in attentions.items():
      model = vit.Model(1000, variant=variant, pool_type="tok", attention=attention,
                        seqlen_alpha=1.0, dtype_mm="bfloat16", attention_impl=impl,
                        attention_block_size=block)
      params = jax.jit(model.init)(jax.random.PRNGKey(1), images[:1])["params"]
      opt_state = jax.jit(tx.init)(params)

      def step(params, opt_state, images, labels, model=model):
        def loss_fn(params):
          logits, _ = model.apply({"params": params}, images, train=True)
          return optax.softmax_cross_entropy(logits, labels).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

      args = (params, opt_state, images, labels)
      compiled, _, statuses[name] = compile_or_skip(step, args, max_peak_gib)
      if compiled is not None:
        runs[name] = compiled, args
    times = common.round_times(runs, rounds=rounds)
    softmaxes = [name for name in times if name.startswith("softmax")]
    best = min(softmaxes, key=lambda name: np.median(times[name])) if softmaxes else None
    length = (image_size // int(variant.split("/")[1])) ** 2 + 1
    for name in attentions:
      seconds = min(times[name]) if name in times else None
      rows.append((variant, length, name, "-" if seconds is None else f"{1e3 * seconds:.2f}",
                   "-" if seconds is None else f"{batch / seconds:.0f}",
                   speed(times, name, best), speed(times, name, "softmax dense"),
                   speed(times, name, DENSE), statuses[name]))
    # Each model's table as soon as it is measured: a command stopped at the device's time
    # limit keeps the models it finished.
    print(f"\n{variant}: one training step (AdamW), batch {batch}, bf16 matmuls, random images; "
          f"best softmax: {best}; speed = other's step time / this one's, per round: median "
          "[quartiles].")
    common.print_table(("model", "L", "attention", "step ms", "images/s",
                        "speed vs best softmax", "speed vs softmax dense", f"speed vs {DENSE}",
                        "status"), rows)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--lengths", default="197,785,4096,16384")
  parser.add_argument("--heads", type=int, default=6)
  parser.add_argument("--pairs", type=float, default=6 * 16384 ** 2,
                      help="b x h x L^2 of every op call (b follows from it)")
  parser.add_argument("--block_size", type=int, default=None,
                      help="pallas's largest tile (default: the kernels', 128 on a GPU, 512 on "
                      "a TPU)")
  parser.add_argument("--chunk_size", type=int, default=512, help="chunked's blocks")
  parser.add_argument("--softmax", choices=SOFTMAX_KERNELS, default=None,
                      help="the softmax baseline (default: cudnn on a GPU, splash on a TPU, xla "
                      "elsewhere)")
  parser.add_argument("--cudnn_multiple", type=int, default=cudnn_attention.LENGTH_MULTIPLE,
                      help="cudnn's (and xla's) lengths are zero-padded to a multiple of this, "
                      "the padding masked by sequence lengths")
  parser.add_argument("--rounds", type=int, default=20)
  parser.add_argument("--max_peak_gib", type=float, default=60.0,
                      help="do not run executables whose compiled peak memory exceeds this")
  parser.add_argument("--tables", default="op,errors,memory",
                      help=f"which of {','.join(TABLES)} to print (one GPU command each fits "
                      "the device's 10 minutes)")
  parser.add_argument("--error_activations", default=",".join(attn.PAPER_ACTIVATIONS),
                      help="activations whose errors are measured at the first length (relu's "
                      "at every length)")
  parser.add_argument("--train_batch", type=int, default=128)
  parser.add_argument("--train_models", default="S/16:224,S/8:224",
                      help="variant:image size of each model of the train table")
  parser.add_argument("--dry", action="store_true",
                      help="CPU check of the script: tiny sizes, XLA softmax (or splash in its "
                      "interpreter), one round")
  args = parser.parse_args()
  device = jax.devices()[0]
  if args.dry:
    # 39 tokens: 3 tiles of 16 (9 padded), an odd length for the padded softmax; mu/8 at 32
    # px: 17 tokens, 2 tiles.
    args.lengths, args.heads, args.pairs, args.rounds = "39", 2, 2 * 2 * 39 ** 2, 1
    args.block_size, args.chunk_size, args.train_batch = 16, 16, 2
    args.softmax = args.softmax or "xla"
    args.error_activations = "relu,gelu"
    args.train_models = "mu/8:32"
  args.softmax = args.softmax or {"gpu": "cudnn", "tpu": "splash"}.get(device.platform, "xla")
  lengths = [int(x) for x in args.lengths.split(",")]
  try:
    models = [(variant, int(size)) for variant, size in
              (model.split(":") for model in args.train_models.split(","))]
  except ValueError:
    parser.error(f"--train_models takes variant:image_size entries (S/16:224,S/8:224), got "
                 f"{args.train_models!r}")
  print(f"jax {jax.__version__}, {device.platform}: {device.device_kind}; pallas tiles "
        f"{args.block_size or 'default'}, chunked blocks {args.chunk_size}, softmax "
        f"{args.softmax}{', DRY RUN' if args.dry else ''}")
  tables = args.tables.split(",")
  if unknown := set(tables) - set(TABLES):
    parser.error(f"unknown --tables {sorted(unknown)}; valid: {', '.join(TABLES)}")
  softmax = softmax_kernel(args.softmax, args.cudnn_multiple, interpret=args.dry)
  impls = implementations(args.block_size, args.chunk_size, softmax, args.softmax)
  if "op" in tables:
    op_table(impls, lengths, args.heads, args.pairs, args.rounds, args.max_peak_gib)
  if "errors" in tables:
    cases = [(a, lengths[0]) for a in args.error_activations.split(",")]
    cases += [("relu", length) for length in lengths[1:]]
    error_table(cases, args.heads, args.block_size, args.max_peak_gib)
  if "memory" in tables:
    memory_table(impls, lengths, args.heads)
  if "train" in tables:
    train_step_table(models, args.train_batch, args.block_size, args.chunk_size, args.rounds,
                     args.max_peak_gib, cudnn=args.softmax == "cudnn")


if __name__ == "__main__":
  main()
