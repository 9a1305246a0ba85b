"""Device mesh and parameter sharding rules (data-parallel, FSDP) for the jitted step.

`mesh` in the config is a list of (axis_name, size) with at most one -1 ("the rest");
`sharding_strategy` is a list of (regex, rule), the first regex found (re.search) in a leaf's
'/'-joined path picks its rule:
  'replicate'          every device holds the whole leaf;
  'fsdp(axis="data")'  the leaf's largest dimension divisible by the axis size is split over that
                       mesh axis (ZeRO-3 style); leaves with no such dimension are replicated.
The same rules apply to optimizer-state leaves, whose paths end with their parameter's path.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

_FSDP = re.compile(r"""^fsdp\(axis=["'](\w+)["']\)$""")


def make_mesh(axes: Sequence[tuple[str, int]], devices: Sequence[jax.Device] | None = None
              ) -> Mesh:
  """A Mesh over `devices` (default: all) with named axes; -1 takes the remaining devices."""
  devices = list(jax.devices() if devices is None else devices)
  names = [name for name, _ in axes]
  sizes = [int(size) for _, size in axes]
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh {list(axes)}: at most one axis may have size -1.")
  known = math.prod(s for s in sizes if s != -1)
  if len(devices) % known:
    raise ValueError(f"mesh {list(axes)} does not divide the {len(devices)} devices.")
  sizes = [len(devices) // known if s == -1 else s for s in sizes]
  if math.prod(sizes) != len(devices):
    raise ValueError(f"mesh {list(axes)} has {math.prod(sizes)} devices but there are "
                     f"{len(devices)}; use -1 for one axis to take the rest.")
  # jax.make_mesh orders devices for the physical topology (TPU ICI rings). Auto axes: the
  # compiler propagates shardings (GSPMD) from the step's in/out shardings, as flax expects;
  # jax's default, Explicit, would put shardings into every intermediate's type.
  return jax.make_mesh(tuple(sizes), tuple(names), devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,) * len(names))


def path_name(path: Sequence[Any]) -> str:
  """A jax key path -> 'a/b/c' (dict keys, attribute names and sequence indices)."""
  parts = []
  for entry in path:
    for attr in ("key", "name", "idx"):
      if hasattr(entry, attr):
        parts.append(str(getattr(entry, attr)))
        break
  return "/".join(parts)


def _spec_for(name: str, shape: Sequence[int], strategy: Sequence[tuple[str, str]],
              mesh: Mesh) -> P:
  for pattern, rule in strategy:
    if re.search(pattern, name):
      if rule == "replicate":
        return P()
      match = _FSDP.match(rule)
      if not match:
        raise ValueError(f"Unknown sharding rule {rule!r}; valid: 'replicate', "
                         "'fsdp(axis=\"NAME\")'.")
      axis = match.group(1)
      if axis not in mesh.shape:
        raise ValueError(f"Sharding rule {rule!r}: mesh has no axis {axis!r} "
                         f"(axes: {', '.join(mesh.axis_names)}).")
      size = mesh.shape[axis]
      candidates = [d for d in np.argsort(shape)[::-1] if shape[d] % size == 0 and shape[d] > 1]
      if not candidates:
        return P()
      spec = [None] * len(shape)
      spec[candidates[0]] = axis
      return P(*spec)
  raise ValueError(f"No sharding_strategy rule matches {name!r}; end the list with "
                   "('.*', 'replicate').")


def tree_shardings(tree: Any, strategy: Sequence[tuple[str, str]], mesh: Mesh) -> Any:
  """NamedShardings for every leaf of an (abstract) pytree, by the strategy rules."""
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: NamedSharding(mesh, _spec_for(path_name(path), leaf.shape, strategy,
                                                       mesh)), tree)
