"""The miniature reproduction's grid: model sizes, sequence lengths, seeds, and the order in which
the study runs its runs (docs/reproduction.md; sweeps in configs/repro/fig*.py).

Every run uses configs/repro/mnist_vit.py with ALL its study arguments spelled out in one order,
so a run shared by two figures (e.g. S, relu, alpha 1, seed 0 is in Figures 1 to 4) has one
run id and is trained once.
"""
from __future__ import annotations

from typing import Any

from big_vision_relu.experiments import recipes
from big_vision_relu.experiments.sweep import FigureSpec, Grid, Run

CONFIG = "configs/repro/mnist_vit.py"
SIZES = ("Ti", "S", "B")  # Figure 1's model sizes; Figures 2-4 use S
PATCHES = (4, 2)  # L = 49 (like /32 models at 224 px) and L = 196 (like /16)
SEEDS = (0, 1, 2)
ALPHAS = recipes.ALPHAS
SEEDED_ALPHAS = (0.0, 1.0)  # Figure 2's points repeated over all SEEDS
FIRST_ALPHAS = (0.0, 0.5, 1.0, 1.5, 2.0)  # the alphas every L = 49 figure gets first
# relu6 comes last at L = 196 (its seeds, then its other alphas): at alpha <= 1 its runs have
# equalled relu's to the last digit (no score exceeds 6 before the L^-alpha scale).
RELU_TWIN = "relu6"
# The order in which the activations get their seeds at L = 196 (relu's come first, with
# softmax's).
SEEDED_ACTIVATIONS_ORDER = ("relu2", "gelu", "softplus", "identity", "sigmoid", RELU_TWIN)
GRID = Grid(CONFIG, dict(size="S", patch=4, attention="relu", alpha=1.0, qk_norm=True,
                         gated=False, seed=0))

FIGURE = FigureSpec(
    accuracy_metric="test/prec@1", accuracy_label="mnist5k test accuracy",
    fewshot_metric="fewshot/10shot_avg", fewshot_label="10-shot digits transfer",
    core_hours_label="CPU core hours", panel_key="patch",
    panel_title="mnist5k, patch {value}", size_key="size")


def run(**args: Any) -> Run:
  """A run of the study: `args` override the defaults (S, patch 4, relu, alpha 1, qk-LN on,
  no gate, seed 0). Softmax takes no alpha, so its alpha is always 1 (one run id)."""
  return GRID.run(**args)


# The study's order: (sweep file, {argument: value or tuple of values}) selects that sweep's
# runs. Cheap and most telling first, so that a study stopped early has whole figures at L = 49
# before anything at L = 196: Figure 1 at seed 0, the seeds of its small models (the first
# measure of seed noise), Figure 2's alpha curves of every activation at alpha 0, 1, 2, then at
# 0.5 and 1.5, Figures 3 and 4 (qk-LN, gate off) at those five alphas, all seeds of Figure 1 and
# of alpha 0 and 1, then the rest; then the same at L = 196 (~6x the cost per run): relu's
# seeds at alpha 0 and 1 and softmax's first (the paper's central claim at the longer sequence),
# then the five first alphas of Figures 2 to 4, the seeds of alpha 0 and 1 one activation at a
# time (whole 3-seed groups first: they decide whether alpha 1's deficit to alpha 0 is beyond
# seed noise), then the other alphas, relu6's last.
PHASES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("configs/repro/fig1.py", {"seed": 0}),
    ("configs/repro/fig1.py", {"size": ("Ti", "S")}),
    ("configs/repro/fig2.py", {"patch": 4, "seed": 0, "alpha": FIRST_ALPHAS[::2]}),
    ("configs/repro/fig2.py", {"patch": 4, "seed": 0, "alpha": FIRST_ALPHAS[1::2]}),
    ("configs/repro/fig3.py", {"patch": 4, "alpha": FIRST_ALPHAS}),
    ("configs/repro/fig4.py", {"patch": 4, "alpha": FIRST_ALPHAS}),
    ("configs/repro/fig1.py", {}),
    ("configs/repro/fig2.py", {"patch": 4, "alpha": SEEDED_ALPHAS}),
    ("configs/repro/fig2.py", {"patch": 4}),
    ("configs/repro/fig3.py", {"patch": 4}),
    ("configs/repro/fig4.py", {"patch": 4}),
    ("configs/repro/fig2.py", {"patch": 2, "attention": ("softmax", "relu"),
                               "alpha": SEEDED_ALPHAS}),
    ("configs/repro/fig2.py", {"patch": 2, "seed": 0, "alpha": FIRST_ALPHAS}),
    ("configs/repro/fig3.py", {"patch": 2, "alpha": FIRST_ALPHAS}),
    ("configs/repro/fig4.py", {"patch": 2, "alpha": FIRST_ALPHAS}),
    *(("configs/repro/fig2.py", {"patch": 2, "attention": activation, "alpha": SEEDED_ALPHAS})
      for activation in SEEDED_ACTIVATIONS_ORDER),
    ("configs/repro/fig2.py", {"patch": 2, "attention": tuple(
        activation for activation in ("relu", *SEEDED_ACTIVATIONS_ORDER)
        if activation != RELU_TWIN)}),
    ("configs/repro/fig3.py", {"patch": 2}),
    ("configs/repro/fig4.py", {"patch": 2}),
    ("configs/repro/fig2.py", {"patch": 2}),
)
