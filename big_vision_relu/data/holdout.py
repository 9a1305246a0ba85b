"""A validation split carved from a training split: stratified, fixed by its own seed.

A data spec (`config.input.data`, an evaluator's `data`) may carry

    holdout=dict(num_examples=5000, seed=0, part="rest")       # train on the other 55,000
    holdout=dict(num_examples=5000, seed=0, part="held_out")   # evaluate on the 5,000
    holdout=dict(num_examples=5000, seed=0, part="rest",       # train on 7,500 of the 55,000
                 rest_examples=7500)

Both parts come from one selection (`select`): from each class, a share of `num_examples` in
proportion to the class's size (largest remainders make the total exact; ties go to the smaller
label), drawn by a permutation seeded with `seed` alone, so the selection depends on the split's
labels and the spec only: not on the run's seed, the batch size or the number of processes. The
parts are disjoint, cover the split and keep the split's order (ascending record numbers).

`rest_examples` (optional, part "rest" only) trains on fewer images: a stratified selection of
that many of the rest, by the same rule with its own stream of `seed` (independent of the
held-out draw). Every class's images come in one fixed order, and a larger subset takes a prefix
of it per class, so subsets are nested whenever the per-class quotas grow with the size (always
for equal classes, as Fashion-MNIST's 5,500 per class of the rest).

Pure numpy: the TFDS path (input_pipeline) and the in-memory path read their labels their own way
and share this selection.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

PARTS = ("rest", "held_out")
KEYS = frozenset({"num_examples", "seed", "part"})
OPTIONAL_KEYS = frozenset({"rest_examples"})
SUBSET_STREAM = 1  # rest_examples draws from the seed sequence (seed, 1), the held-out part (seed)


def check_spec(where: str, spec: Any) -> None:
  """Raises ValueError saying what to set unless `spec` is None or a valid holdout dict."""
  if spec is None:
    return
  example = "dict(num_examples=5000, seed=0, part='rest' | 'held_out')"
  if not isinstance(spec, Mapping) and not hasattr(spec, "items"):  # a dict or a ConfigDict
    raise ValueError(f"{where} must be {example}, got {spec!r}.")
  spec = dict(spec.items())
  unknown, missing = set(spec) - KEYS - OPTIONAL_KEYS, KEYS - set(spec)
  if unknown or missing:
    raise ValueError(f"{where}={dict(spec)} must be {example} (optionally rest_examples=N); "
                     f"unknown keys: {sorted(unknown)}, missing: {sorted(missing)}.")
  num, seed, part = spec["num_examples"], spec["seed"], spec["part"]
  if isinstance(num, bool) or not isinstance(num, int) or num <= 0:
    raise ValueError(f"{where}.num_examples={num!r} must be a positive int.")
  if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
    raise ValueError(f"{where}.seed={seed!r} must be an int >= 0.")
  if part not in PARTS:
    raise ValueError(f"{where}.part={part!r} must be one of {', '.join(PARTS)}.")
  if (rest := spec.get("rest_examples")) is not None:
    if isinstance(rest, bool) or not isinstance(rest, int) or rest <= 0:
      raise ValueError(f"{where}.rest_examples={rest!r} must be a positive int (or unset: all "
                       "of the rest).")
    if part != "rest":
      raise ValueError(f"{where}.rest_examples={rest} subsets the part 'rest' only; drop it "
                       f"from the {part!r} spec (the held-out part never shrinks).")


def part_size(split_size: int, spec: Mapping[str, Any] | None) -> int:
  """The number of examples of `spec`'s part of a split of `split_size` (all of it for None)."""
  if spec is None:
    return split_size
  if spec["num_examples"] >= split_size:
    raise ValueError(f"holdout.num_examples={spec['num_examples']} must be smaller than the "
                     f"split it is carved from ({split_size} examples).")
  if spec["part"] == "held_out":
    return spec["num_examples"]
  rest = split_size - spec["num_examples"]
  if (subset := spec.get("rest_examples")) is None:
    return rest
  if subset >= rest:
    raise ValueError(f"holdout.rest_examples={subset} must be smaller than the rest it is drawn "
                     f"from ({rest} examples); unset it to train on all of them.")
  return subset


def select(labels: np.ndarray, num_examples: int, seed: int | tuple[int, ...]) -> np.ndarray:
  """Record numbers (sorted int64 `[num_examples]`) of the held-out part of a split whose
  records have `labels` (int `[n]`, in record order): stratified by label (module docstring).
  `seed`: an int, or a tuple of ints (numpy's SeedSequence entropy) for another stream."""
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f"labels must be one label per record, shape [n]; got {labels.shape}.")
  n = len(labels)
  part_size(n, dict(num_examples=num_examples, seed=0, part="held_out"))  # checks the size
  classes, counts = np.unique(labels, return_counts=True)
  quotas = num_examples * counts / n
  take = np.floor(quotas).astype(np.int64)
  # Largest remainders get the examples left over; a stable sort keeps ties in label order.
  order = np.argsort(-(quotas - take), kind="stable")
  take[order[:num_examples - take.sum()]] += 1
  rng = np.random.Generator(np.random.PCG64(seed))
  chosen = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, take)]
  return np.sort(np.concatenate(chosen)).astype(np.int64)


def records(labels: np.ndarray, spec: Mapping[str, Any] | None) -> np.ndarray:
  """Record numbers (sorted int64) of `spec`'s part of a split with `labels`; all for None."""
  n = len(labels)
  if spec is None:
    return np.arange(n, dtype=np.int64)
  held_out = select(labels, spec["num_examples"], spec["seed"])
  if spec["part"] == "held_out":
    return held_out
  keep = np.ones(n, bool)
  keep[held_out] = False
  rest = np.flatnonzero(keep).astype(np.int64)
  if (subset := spec.get("rest_examples")) is None:
    return rest
  part_size(n, spec)  # checks the subset's size
  return rest[select(labels[rest], subset, (spec["seed"], SUBSET_STREAM))]
