"""Few-shot linear-probe maths: closed-form ridge regression on frozen features.

Pure NumPy in float64; no jax. The boundary with the model-facing evaluator (which embeds
datasets with a model) is: features are float arrays `[N, D]`, labels are int arrays `[N]`
with values in `[0, num_classes)`.

The recipe (big_vision's `fewshot_lsr` protocol, reimplemented from its description):

1. Subset (`fewshot_subsets`): for each seed `s` and `k` shots, draw from
   `np.random.default_rng(s)` one permutation per class, classes in increasing order, and
   keep its first `k` examples. The permutations do not depend on `k`, so for one seed the
   5-shot subset is contained in the 10-shot subset.
2. Standardise every feature with the mean and std (`ddof=0`) of the few-shot TRAIN subset,
   with `STD_EPS` added to the std so constant features do not divide by zero. The test
   set uses the train statistics.
3. Append a constant bias feature of value `BIAS_FEATURE` (100). The ridge penalty
   `l2 * w_bias**2` acts on the weight of this column, whose effective bias is
   `100 * w_bias`, so the bias itself is penalised by `l2 / 100**2` only: nearly
   unregularised, while keeping one closed form for weights and bias. 100 is large next to
   the unit-variance standardised features, and the column's diagonal entry of `X^T X`
   (`N * 1e4`) dwarfs the default l2 (`2**10`).
4. Targets: one-hot in `{-1, +1}`, shape `[N, C]`.
5. Ridge: `W = argmin ||X W - T||^2 + l2 ||W||^2 = (X^T X + l2 I)^-1 X^T T`, computed from ONE
   `numpy.linalg.eigh` of `X^T X` (primal, when `N >= D + 1`) or of `X X^T` (dual, when
   `N < D + 1`), reused for every l2 (see `RidgeProbe`).
6. Accuracy: `mean(argmax(x_test @ W) == y_test)`.

l2 selection: the paper protocol uses a fixed `l2 = 2**10`. `loo_cv_l2` additionally
picks l2 on the TRAIN subset only, by closed-form leave-one-out cross-validation; the test set
is never used to choose l2.

Metric names written by `fewshot_results` (`d` = dataset name, `k` = shots,
`s` = seed) and `fewshot_average`:

- `{d}_{k}shot_seed{s}`      test accuracy at the fixed l2
- `{d}_{k}shot`              its mean over seeds (the paper's per-dataset number)
- `{d}_{k}shot_std`          its population std over seeds (`ddof=0`)
- `{d}_{k}shot_loo_l2_seed{s}` the l2 chosen by leave-one-out on the train subset
- `{d}_{k}shot_loo_seed{s}`  test accuracy at that l2
- `{d}_{k}shot_loo`          its mean over seeds
- `{k}shot_avg`              mean over datasets of `{d}_{k}shot` (the paper's "average
  10-shot linear transfer on 8 datasets"); `{k}shot_loo_avg` likewise for `_loo`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

BIAS_FEATURE = 100.0
"""Value of the constant feature appended for the bias (see the module docstring)."""
STD_EPS = 1e-5
"""Added to the per-feature train std before dividing."""
DEFAULT_L2 = 2.0**10
"""The fixed ridge l2 of the few-shot protocol."""
DEFAULT_LOO_L2_GRID = tuple(2.0**i for i in range(-10, 21))
"""l2 values searched by leave-one-out: 2^-10 ... 2^20."""


def _check_num_classes(num_classes: int) -> int:
  if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)):
    raise TypeError(f"num_classes must be an int, got {num_classes!r}")
  if num_classes < 2:
    raise ValueError(f"num_classes must be >= 2, got {num_classes}")
  return int(num_classes)


def _check_labels(labels: np.ndarray, num_classes: int | None, what: str) -> np.ndarray:
  """Returns `labels` as int64 `[N]` after checking dtype and range."""
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f"{what} labels must be 1-D [N], got shape {labels.shape}")
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"{what} labels must be integers, got dtype {labels.dtype}")
  if labels.size and labels.min() < 0:
    raise ValueError(f"{what} labels must be >= 0, got {labels.min()}")
  if num_classes is not None and labels.size and labels.max() >= num_classes:
    raise ValueError(f"{what} labels must be < num_classes={num_classes}, got {labels.max()}")
  return labels.astype(np.int64)


def _check_features(
  feats: np.ndarray,
  labels: np.ndarray,
  num_classes: int,
  what: str,
) -> tuple[np.ndarray, np.ndarray]:
  """Returns (float64 features `[N, D]`, int64 labels `[N]`) after checking them."""
  feats = np.asarray(feats, dtype=np.float64)
  if feats.ndim != 2:
    raise ValueError(f"{what} features must be 2-D [N, D], got shape {feats.shape}")
  if feats.shape[0] == 0:
    raise ValueError(f"{what} features are empty")
  if not np.all(np.isfinite(feats)):
    raise ValueError(f"{what} features contain NaN or inf")
  labels = _check_labels(labels, num_classes, what)
  if labels.shape != (feats.shape[0],):
    raise ValueError(
      f"{what} labels have shape {labels.shape}, expected ({feats.shape[0]},) to match the features"
    )
  return feats, labels


def _check_l2_regs(l2_regs: Sequence[float]) -> tuple[float, ...]:
  l2s = tuple(float(l2) for l2 in l2_regs)
  if not l2s:
    raise ValueError("l2_regs is empty")
  bad = [l2 for l2 in l2s if not (np.isfinite(l2) and l2 > 0)]
  if bad:
    raise ValueError(f"every l2 must be finite and > 0, got {bad}")
  return l2s


@dataclasses.dataclass(frozen=True, eq=False)
class RidgeProbe:
  """Ridge regression of `{-1, +1}` one-hot targets on standardised features + bias, solved
  through one eigendecomposition so each extra l2 costs only matrix products.

  With `X` `[N, P]` (standardised features and the bias column, `P = D + 1`) and
  targets `T` `[N, C]`:

  - primal: `X^T X = Q diag(e) Q^T` and `W(l2) = Q diag(1/(e + l2)) Q^T X^T T`;
  - dual:   `X X^T = U diag(e) U^T` and `W(l2) = X^T U diag(1/(e + l2)) U^T T`
    (from `(X^T X + l2 I)^-1 X^T = X^T (X X^T + l2 I)^-1`).

  Both are stored as `W(l2) = left @ diag(1/(e + l2)) @ right` with `left` `[P, r]`,
  `right` `[r, C]`, `r = P` (primal) or `N` (dual). `form='auto'` takes the smaller
  eigenproblem: dual when `N < P`.

  Leave-one-out uses the same decomposition (`loo_predictions`). Build with
  `fit`.
  """

  num_classes: int
  form: Literal["primal", "dual"]
  mean: np.ndarray  # [D] train feature mean.
  std: np.ndarray  # [D] train feature std + STD_EPS.
  eigvals: np.ndarray  # [r] eigenvalues of X^T X (primal) or X X^T (dual), clipped at 0.
  left: np.ndarray  # [P, r]
  right: np.ndarray  # [r, C]
  # [N, r]: X Q (primal) or U (dual); with `right` it gives the train fit and hat matrix.
  train_basis: np.ndarray
  targets: np.ndarray  # [N, C] in {-1, +1}.
  labels: np.ndarray  # [N] int64.

  @classmethod
  def fit(
    cls,
    x_train: np.ndarray,
    y_train: np.ndarray,
    *,
    num_classes: int,
    form: Literal["auto", "primal", "dual"] = "auto",
  ) -> RidgeProbe:
    """Standardises `x_train` `[N, D]`, builds targets from `y_train` `[N]` and runs
    the one `eigh`. `form` forces the primal or dual path (both give the same W)."""
    num_classes = _check_num_classes(num_classes)
    x_train, y_train = _check_features(x_train, y_train, num_classes, "train")
    if form not in ("auto", "primal", "dual"):
      raise ValueError(f"form must be 'auto', 'primal' or 'dual', got {form!r}")
    mean = x_train.mean(axis=0)
    std = x_train.std(axis=0) + STD_EPS
    x = _design_matrix(x_train, mean, std)
    num_points, dim = x.shape
    targets = 2.0 * np.eye(num_classes)[y_train] - 1.0
    if form == "auto":
      form = "dual" if num_points < dim else "primal"
    if form == "primal":
      eigvals, q = np.linalg.eigh(x.T @ x)
      left, basis = q, x @ q
    else:
      eigvals, u = np.linalg.eigh(x @ x.T)
      left, basis = x.T @ u, u
    # Both are Gram matrices, so the exact eigenvalues are >= 0; clipping removes only
    # rounding noise that could otherwise make e + l2 tiny for a tiny l2.
    eigvals = np.clip(eigvals, 0.0, None)
    right = basis.T @ targets  # Q^T X^T T (primal) or U^T T (dual).
    return cls(
      num_classes=num_classes,
      form=form,
      mean=mean,
      std=std,
      eigvals=eigvals,
      left=left,
      right=right,
      train_basis=basis,
      targets=targets,
      labels=y_train,
    )

  def design(self, feats: np.ndarray) -> np.ndarray:
    """`[M, D]` features -> `[M, D + 1]` standardised with the TRAIN stats, bias last."""
    feats = np.asarray(feats, dtype=np.float64)
    if feats.ndim != 2 or feats.shape[1] != self.mean.shape[0]:
      raise ValueError(f"features must be [M, {self.mean.shape[0]}], got shape {feats.shape}")
    return _design_matrix(feats, self.mean, self.std)

  def weights(self, l2: float) -> np.ndarray:
    """Ridge weights `[D + 1, C]` (bias row last) for one l2."""
    (l2,) = _check_l2_regs([l2])
    return (self.left / (self.eigvals + l2)) @ self.right

  def accuracies(
    self,
    x_test: np.ndarray,
    y_test: np.ndarray,
    l2_regs: Sequence[float],
  ) -> dict[float, float]:
    """Test accuracy `mean(argmax(design(x_test) @ W(l2)) == y_test)` for each l2."""
    l2s = _check_l2_regs(l2_regs)
    x_test, y_test = _check_features(x_test, y_test, self.num_classes, "test")
    # Projecting once onto `left` makes every further l2 an [M, r] x [r, C] product.
    projected = self.design(x_test) @ self.left
    accs = {}
    for l2 in l2s:
      scores = (projected / (self.eigvals + l2)) @ self.right
      accs[l2] = float(np.mean(np.argmax(scores, axis=1) == y_test))
    return accs

  def loo_predictions(self, l2: float) -> np.ndarray:
    """Leave-one-out predictions `[N, C]`: row i is what the ridge fit on the other
    N - 1 train examples predicts for example i.

    Standard closed form with the hat matrix `H = X (X^T X + l2 I)^-1 X^T`: the LOO
    residual is `(t_i - (H T)_i) / (1 - h_ii)` (one `h_ii` for all C outputs), and the
    LOO prediction is `t_i` minus it. The standardisation statistics stay those of the
    full train subset: this is the LOO of the ridge fit given the standardisation.

    In the dual form `I - H = l2 G^-1` with `G = X X^T + l2 I`, so the residual is
    `(G^-1 T)_i / (G^-1)_ii`; that avoids the cancellation in `1 - h_ii` when `N < P`
    and a small l2 nearly interpolates the train set.
    """
    (l2,) = _check_l2_regs([l2])
    inv = 1.0 / (self.eigvals + l2)
    basis = self.train_basis
    if self.form == "primal":
      fitted = (basis * inv) @ self.right  # H T
      leverage = (basis**2) @ inv  # diag(H)
      residual = (self.targets - fitted) / (1.0 - leverage)[:, None]
    else:
      g_inv_t = (basis * inv) @ self.right  # G^-1 T
      g_inv_diag = (basis**2) @ inv  # diag(G^-1)
      residual = g_inv_t / g_inv_diag[:, None]
    return self.targets - residual

  def loo_accuracies(self, l2_regs: Sequence[float]) -> dict[float, float]:
    """Leave-one-out accuracy on the train subset for each l2."""
    return {
      l2: float(np.mean(np.argmax(self.loo_predictions(l2), axis=1) == self.labels))
      for l2 in _check_l2_regs(l2_regs)
    }


def _design_matrix(feats: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
  """`[M, D]` -> `[M, D + 1]`: standardised features, then the constant bias column."""
  standardised = (feats - mean) / std
  bias = np.full((feats.shape[0], 1), BIAS_FEATURE)
  return np.concatenate([standardised, bias], axis=1)


def ridge_probe_accuracy(
  x_train: np.ndarray,
  y_train: np.ndarray,
  x_test: np.ndarray,
  y_test: np.ndarray,
  *,
  num_classes: int,
  l2_regs: Sequence[float],
) -> dict[float, float]:
  """Few-shot ridge probe test accuracy per l2.

  Args:
    x_train: `[N, D]` features of the few-shot train subset.
    y_train: `[N]` int labels in `[0, num_classes)`.
    x_test: `[M, D]` test features.
    y_test: `[M]` int test labels.
    num_classes: C, the width of the one-hot targets.
    l2_regs: ridge l2 values, each > 0; all share one eigendecomposition.

  Returns:
    `{l2: accuracy}` with accuracy in [0, 1].
  """
  l2s = _check_l2_regs(l2_regs)
  probe = RidgeProbe.fit(x_train, y_train, num_classes=num_classes)
  return probe.accuracies(x_test, y_test, l2s)


def _select_l2(loo_accs: Mapping[float, float]) -> float:
  """Highest LOO accuracy; ties (common, accuracy is a multiple of 1/N) go to the largest
  l2, the most regularised of the equally good fits."""
  best = max(loo_accs.values())
  return max(l2 for l2, acc in loo_accs.items() if acc == best)


def loo_cv_l2(
  x_train: np.ndarray,
  y_train: np.ndarray,
  *,
  num_classes: int,
  l2_regs: Sequence[float] = DEFAULT_LOO_L2_GRID,
) -> tuple[float, dict[float, float]]:
  """Chooses l2 by closed-form leave-one-out cross-validation on the train subset only.

  Args:
    x_train: `[N, D]` features of the few-shot train subset.
    y_train: `[N]` int labels in `[0, num_classes)`.
    num_classes: C.
    l2_regs: candidate l2 values (> 0), all served by one eigendecomposition.

  Returns:
    `(best_l2, {l2: LOO accuracy})`. `best_l2` has the highest LOO accuracy; ties go to
    the largest l2. See `RidgeProbe.loo_predictions` for the closed form.

  At 1 shot, leaving an example out removes its class from the fit, so the LOO accuracy says
  nothing about l2 there; the selection is meaningful from 2 shots up.
  """
  l2s = _check_l2_regs(l2_regs)
  loo_accs = RidgeProbe.fit(x_train, y_train, num_classes=num_classes).loo_accuracies(l2s)
  return _select_l2(loo_accs), loo_accs


def fewshot_subsets(
  labels: np.ndarray,
  shots: int,
  seed: int,
  *,
  num_classes: int | None = None,
) -> np.ndarray:
  """Indices of a k-shot train subset.

  `rng = np.random.default_rng(seed)`; for each class `c = 0, 1, ..., C - 1` in order,
  `rng.permutation(idx_c)[:shots]` where `idx_c` are the positions of class `c` in
  `labels` in increasing order. The draws do not depend on `shots`, so for one seed
  smaller subsets are nested in larger ones.

  Args:
    labels: `[N]` int labels of the full train split.
    shots: k >= 1 examples per class.
    seed: seed of `np.random.default_rng`.
    num_classes: C; defaults to `labels.max() + 1`. Every class in `[0, C)` needs at least
      `shots` examples.

  Returns:
    int64 indices `[C * shots]` into `labels`, grouped by class in class order.

  Raises:
    ValueError: naming every class with fewer than `shots` examples.
  """
  if isinstance(shots, bool) or not isinstance(shots, (int, np.integer)) or shots < 1:
    raise ValueError(f"shots must be an int >= 1, got {shots!r}")
  if num_classes is not None:
    num_classes = _check_num_classes(num_classes)
  labels = _check_labels(labels, num_classes, "train")
  if labels.size == 0:
    raise ValueError("labels are empty")
  if num_classes is None:
    num_classes = int(labels.max()) + 1
  counts = np.bincount(labels, minlength=num_classes)
  short = np.flatnonzero(counts < shots)
  if short.size:
    detail = ", ".join(f"class {c} has {counts[c]}" for c in short)
    raise ValueError(f"{shots}-shot subset needs {shots} examples per class: {detail}")
  # A stable sort groups each class's positions in increasing order, like flatnonzero.
  by_class = np.split(np.argsort(labels, kind="stable"), np.cumsum(counts)[:-1])
  rng = np.random.default_rng(seed)
  return np.concatenate([rng.permutation(idx)[:shots] for idx in by_class])


def fewshot_results(
  train_feats: np.ndarray,
  train_labels: np.ndarray,
  test_feats: np.ndarray,
  test_labels: np.ndarray,
  *,
  name: str,
  num_classes: int,
  shots: Sequence[int] = (10,),
  seeds: Sequence[int] = (0, 1, 2),
  l2_reg: float = DEFAULT_L2,
  loo_l2_grid: Sequence[float] = DEFAULT_LOO_L2_GRID,
) -> dict[str, float]:
  """All few-shot metrics of one dataset, named as in the module docstring.

  For each `k` in `shots` and `s` in `seeds`: the k-shot subset of the train split
  (`fewshot_subsets`), one `RidgeProbe` fit, test accuracy at `l2_reg`, the l2
  chosen by leave-one-out over `loo_l2_grid` on the subset, and test accuracy at that l2.

  Args:
    train_feats: `[N, D]` features of the full train split.
    train_labels: `[N]` int labels.
    test_feats: `[M, D]` test features.
    test_labels: `[M]` int labels.
    name: dataset name, the prefix of every metric.
    num_classes: C.
    shots: the k values.
    seeds: subset seeds; the per-dataset numbers are means over them.
    l2_reg: the fixed l2 of the protocol.
    loo_l2_grid: l2 candidates for leave-one-out selection.

  Returns:
    flat `{metric name: value}`; accuracies in [0, 1].
  """
  if not name:
    raise ValueError("name must be a non-empty dataset name")
  num_classes = _check_num_classes(num_classes)
  (l2_reg,) = _check_l2_regs([l2_reg])
  loo_grid = _check_l2_regs(loo_l2_grid)
  for what, values in (("shots", shots), ("seeds", seeds)):
    if not values or len(set(values)) != len(values):
      raise ValueError(f"{what} must be non-empty and without repeats, got {values!r}")
  train_feats, train_labels = _check_features(train_feats, train_labels, num_classes, "train")
  test_feats, test_labels = _check_features(test_feats, test_labels, num_classes, "test")
  if test_feats.shape[1] != train_feats.shape[1]:
    raise ValueError(
      f"train features have dim {train_feats.shape[1]}, test features {test_feats.shape[1]}"
    )

  metrics: dict[str, float] = {}
  for k in shots:
    fixed, loo = [], []
    for s in seeds:
      idx = fewshot_subsets(train_labels, k, s, num_classes=num_classes)
      probe = RidgeProbe.fit(train_feats[idx], train_labels[idx], num_classes=num_classes)
      best_l2 = _select_l2(probe.loo_accuracies(loo_grid))
      accs = probe.accuracies(test_feats, test_labels, [l2_reg, best_l2])
      fixed.append(accs[l2_reg])
      loo.append(accs[best_l2])
      metrics[f"{name}_{k}shot_seed{s}"] = accs[l2_reg]
      metrics[f"{name}_{k}shot_loo_l2_seed{s}"] = best_l2
      metrics[f"{name}_{k}shot_loo_seed{s}"] = accs[best_l2]
    metrics[f"{name}_{k}shot"] = float(np.mean(fixed))
    metrics[f"{name}_{k}shot_std"] = float(np.std(fixed))
    metrics[f"{name}_{k}shot_loo"] = float(np.mean(loo))
  return metrics


def fewshot_average(
  metrics: Mapping[str, float],
  datasets: Sequence[str],
  *,
  shots: Sequence[int] = (10,),
) -> dict[str, float]:
  """Means over datasets: `{k}shot_avg` of `{d}_{k}shot` and `{k}shot_loo_avg` of
  `{d}_{k}shot_loo`, for each k.

  Raises:
    ValueError: if a dataset's metric is missing (a partial average would silently change
      what the number means).
  """
  if not datasets:
    raise ValueError("datasets is empty")
  averages = {}
  for k in shots:
    for suffix, out in (("shot", f"{k}shot_avg"), ("shot_loo", f"{k}shot_loo_avg")):
      keys = [f"{d}_{k}{suffix}" for d in datasets]
      missing = [key for key in keys if key not in metrics]
      if missing:
        raise ValueError(f"cannot compute {out}: missing metrics {missing}")
      averages[out] = float(np.mean([metrics[key] for key in keys]))
  return averages
