"""mixup (Zhang et al., 2017) inside the jitted train step, with big_vision's semantics.

One mixing ratio per call (not per example): ratio ~ Dirichlet(p, ..., p) over n terms; for
n = 2 that is (lam, 1 - lam) with lam ~ Beta(p, p). Every array x (images AND labels, so they
stay consistent) becomes

    sum_i ratio[i] * roll(x, i, axis=0)

i.e. for n = 2 each example is mixed with its neighbour in the batch (the batch rolled by
one): x' = lam * x + (1 - lam) * roll(x, 1).

Under `jax.jit` with a global batch sharded over devices, the roll crosses shard boundaries:
XLA moves one example per device to its neighbour (a collective permute), which is cheap.
This needs the mesh's data axis to be `AxisType.Auto` (as `sharding.make_mesh` makes it):
with Explicit axes jax does not implement the roll of a sharded axis.
`fold_in` is big_vision's option for per-device code (`shard_map` / `pmap`): the name of a
mapped axis whose index is folded into the key, so each device draws its own ratio; with
`jax.jit` over global arrays leave it None (big_vision's configs also set `fold_in=None`).
"""
from typing import Any

import jax
import jax.numpy as jnp


def mixup(rng: jax.Array, arrays: Any, *, p: float, fold_in: str | None = None,
          n: int = 2) -> Any:
  """Mixes every leaf of `arrays` (a pytree of float [batch, ...]) with the same ratio.

  Args:
    rng: PRNG key, consumed (pass a key reserved for mixup).
    arrays: e.g. {'image': f32[B, H, W, C], 'labels': f32[B, K]} or a tuple of arrays; all
      leaves share the leading batch axis.
    p: Dirichlet / Beta concentration (> 0): small p mixes little, p = 1 is uniform.
    fold_in: mapped axis name whose index is folded into `rng` (only inside shard_map/pmap).
    n: number of rolled copies mixed (>= 2).

  Returns:
    The same pytree structure, each leaf sum_i ratio[i] * roll(leaf, i, axis=0).
  """
  if p <= 0:
    raise ValueError(f"mixup: p must be > 0, got {p}")
  if n < 2:
    raise ValueError(f"mixup: n must be >= 2, got {n}")
  for x in jax.tree.leaves(arrays):
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise TypeError(f"mixup mixes float arrays only, got {x.dtype} {x.shape}: one-hot the "
                      "labels and scale the images to floats first")
  if fold_in is not None:
    rng = jax.random.fold_in(rng, jax.lax.axis_index(fold_in))
  ratio = jax.random.dirichlet(rng, jnp.full((n,), p, jnp.float32))

  def mix(x: jax.Array) -> jax.Array:
    r = ratio.astype(x.dtype)
    return sum(r[i] * jnp.roll(x, i, axis=0) for i in range(n))

  return jax.tree.map(mix, arrays)
