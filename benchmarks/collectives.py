r"""Bytes moved by collectives: sequence-parallel relu/L (ring) vs all-gather baselines.

    python benchmarks/collectives.py [--devices 8] [--length 4096] [--heads 6]

Forward + backward (output and dq, dk, dv) of one `[1, L, heads, 64]` self-attention with the
sequence split over a mesh axis 'seq' of `--devices` simulated CPU devices. Nothing is run: the
per-device program that XLA compiled (`compiled.as_text()`, after SPMD partitioning) is parsed,
every collective's operand bytes are summed, each multiplied by the trip count of the loops it
sits in (the ring is a `scan`, i.e. an HLO while loop). Two sums are printed:
  operand bytes: the sizes of the collectives' operands, as written in the HLO;
  sent per device: what each device transmits with the usual ring algorithms: a permute sends
    its operand once, an all-gather (n-1) x its operand, a reduce-scatter (n-1)/n x its operand,
    an all-reduce 2 (n-1)/n x its operand (n = devices in the group).
Implementations: relu/L seq_parallel (ours), and `shard_map` baselines that all-gather the keys
and values over 'seq' and attend densely with softmax (the baseline) or relu/L (the same maths
as ours, to separate the algorithm from the activation); their backward is jax's transpose of
the all-gather, a reduce-scatter of dk and dv.
"""
from __future__ import annotations

import argparse
import os
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")
DEVICES_FLAG = "--xla_force_host_platform_device_count"


def _set_device_count() -> None:
  """Simulated devices must be requested before jax is imported (hence the late imports)."""
  parser = argparse.ArgumentParser(add_help=False)
  parser.add_argument("--devices", type=int, default=8)
  count = parser.parse_known_args()[0].devices
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {DEVICES_FLAG}={count}".strip()


_set_device_count()

import functools  # noqa: E402

import jax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from big_vision_relu import sharding  # noqa: E402
from big_vision_relu.models import attention as attn  # noqa: E402
from big_vision_relu.models import blockwise  # noqa: E402

import common  # noqa: E402

HEAD_DIM = 64
SEQ = "seq"
COLLECTIVES = ("all-gather", "collective-permute", "all-reduce", "reduce-scatter", "all-to-all")
BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f64": 8, "pred": 1}


def all_gather_attention(mesh, activation: str):
  """The baseline: each device gathers every key and value, then attends densely."""
  def local(q, k, v):
    k, v = (jax.lax.all_gather(x, SEQ, axis=1, tiled=True) for x in (k, v))
    return attn.dot_product_attention(q, k, v, activation=activation, seqlen_alpha=1.0)
  spec = P(None, SEQ)
  return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)


def _shape_bytes(shape: str) -> int:
  """'f32[1,512,6,64]' (or a tuple of such) -> bytes."""
  total = 0
  for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shape):
    size = BYTES[dtype]
    for d in filter(None, dims.split(",")):
      size *= int(d)
    total += size
  return total


def collective_bytes(hlo: str, num_devices: int) -> dict[str, dict[str, float]]:
  """{op kind: {'count', 'operand', 'sent'}} over the compiled per-device HLO module, with
  every op weighted by how many times its computation runs (while-loop trip counts)."""
  computations: dict[str, list[str]] = {}
  current = None
  for line in hlo.splitlines():
    header = re.match(r"^(?:ENTRY )?%(\S+) .*\{$", line)
    if header:
      current = computations.setdefault(header.group(1), [])
    elif current is not None and line.strip() and line.strip() != "}":
      current.append(line)
  entry = re.search(r"^ENTRY %(\S+) ", hlo, re.MULTILINE).group(1)

  # How many times each computation runs: callees inherit their caller's count, loop bodies
  # times the loop's known trip count.
  runs = {entry: 1}
  pending = [entry]
  while pending:
    name = pending.pop()
    for line in computations[name]:
      trips = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', line)
      for callee in re.findall(r"(?:body|condition|calls|to_apply|branch_computations)="
                               r"\{?%([\w.\-]+)", line):
        multiplier = int(trips.group(1)) if trips and "body=%" + callee in line else 1
        if callee in computations and callee not in runs:
          runs[callee] = runs[name] * multiplier
          pending.append(callee)

  stats = {kind: {"count": 0, "operand": 0.0, "sent": 0.0} for kind in COLLECTIVES}
  for name, count in runs.items():
    shapes = {}
    for line in computations[name]:
      match = re.match(r"\s*(?:ROOT )?%(\S+) = (\S+|\([^)]*\)) (\S+?)\((.*?)\)", line)
      if not match:
        continue
      var, shape, op, operands = match.groups()
      shapes[var] = shape
      kind = op.removesuffix("-start")
      if kind not in stats or op.endswith("-done"):
        continue
      groups = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
      group = len(groups.group(1).split(",")) if groups else num_devices
      operand = sum(_shape_bytes(shapes.get(o.lstrip("%"), ""))
                    for o in re.findall(r"%[\w.\-]+", operands))
      sent = {"collective-permute": operand, "all-gather": (group - 1) * operand,
              "reduce-scatter": (group - 1) / group * operand,
              "all-reduce": 2 * (group - 1) / group * operand,
              "all-to-all": (group - 1) / group * operand}[kind]
      stats[kind]["count"] += count
      stats[kind]["operand"] += count * operand
      stats[kind]["sent"] += count * sent
  return stats


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--devices", type=int, default=8, help="simulated CPU devices = ring size")
  parser.add_argument("--length", type=int, default=4096)
  parser.add_argument("--heads", type=int, default=6)
  parser.add_argument("--block_size", type=int, default=512)
  args = parser.parse_args()
  mesh = sharding.make_mesh([(SEQ, args.devices)])
  shape = (1, args.length, args.heads, HEAD_DIM)
  inputs = [jax.ShapeDtypeStruct(shape, "float32", sharding=NamedSharding(mesh, P(None, SEQ)))
            for _ in range(4)]
  shard_mib = 4 * args.length * args.heads * HEAD_DIM / args.devices / common.MIB
  print(f"jax {jax.__version__}; {args.devices} devices on 'seq'; {list(shape)} float32: one "
        f"q/k/v shard is {shard_mib:.2f} MiB")

  impls = {
      "relu/L seq_parallel (ring)": functools.partial(
          blockwise.seq_parallel_pointwise_attention, attn.AttentionOptions(
              activation="relu", seqlen_alpha=1.0, impl="seq_parallel", mesh=mesh,
              block_size=args.block_size)),
      "softmax all-gather": all_gather_attention(mesh, "softmax"),
      "relu/L all-gather": all_gather_attention(mesh, "relu"),
  }
  results = {}
  for name, fn in impls.items():
    def step(q, k, v, d_out, fn=fn):
      out, vjp = jax.vjp(fn, q, k, v)
      return out, vjp(d_out)
    compiled = common.compile_fn(step, *inputs)
    results[name] = collective_bytes(compiled.as_text(), args.devices), common.memory_mib(compiled)

  baseline = sum(s["sent"] for s in results["softmax all-gather"][0].values())
  rows = []
  for name, (stats, memory) in results.items():
    ops = ", ".join(f"{s['count']} {kind}" for kind, s in stats.items() if s["count"])
    operand = sum(s["operand"] for s in stats.values())
    sent = sum(s["sent"] for s in stats.values())
    rows.append((name, ops, f"{operand / common.MIB:.2f}", f"{sent / common.MIB:.2f}",
                 common.ratio(sent, baseline), f"{memory['peak']:.1f}"))
  print()
  common.print_table(("implementation", "collectives executed (per device)",
                      "operand MiB", "sent per device MiB", "sent vs softmax all-gather",
                      "peak MiB per device"), rows)


if __name__ == "__main__":
  main()
