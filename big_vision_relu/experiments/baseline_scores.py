"""Reads `experiments.baselines`' JSON (its keys: that module's docstring) without importing what
computed it (jax, scikit-learn)."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def random_init_mean(found: Mapping[str, float], prefix: str, suffix: str) -> float | None:
  """The mean over the random networks' seeds of the scores under `prefix` ending in `suffix`
  (e.g. `prefix="test/", suffix="/ridge"`); None when the JSON has none."""
  values = [v for k, v in found.items()
            if k.startswith(prefix) and "/random_init/" in k and k.endswith(suffix)]
  return float(np.mean(values)) if values else None
