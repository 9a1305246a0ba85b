"""The miniature reproduction on MNIST-5k (docs/reproduction.md): its grid (model sizes,
sequence lengths, seeds), its four figures' sweeps (configs/repro/fig*.py list them) and the
order in which the study runs its runs. Finished: 250 runs in results/repro.

Every run uses configs/repro/mnist_vit.py with ALL its study arguments spelled out in one order,
so a run shared by two figures (e.g. S, relu, alpha 1, seed 0 is in Figures 1 to 4) has one
run id and is trained once.
"""
from __future__ import annotations

from typing import Any

from big_vision_relu.experiments import plans, recipes
from big_vision_relu.experiments.sweep import FigureSpec, Grid, Run
from big_vision_relu.models.attention import PAPER_ACTIVATIONS

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


def fig1() -> list[Run]:
  """Softmax vs relu/L over the three model sizes at L = 49, 3 seeds each (18 runs)."""
  return [run(size=size, attention=attention, seed=seed)
          for size in SIZES for attention in ("softmax", "relu") for seed in SEEDS]


def fig2() -> list[Run]:
  """Every activation of `L^-alpha * h` over ALPHAS, and softmax, at both lengths, seed 0; seeds
  1 and 2 too at SEEDED_ALPHAS (and for softmax): 114 + 60 runs."""
  runs = []
  for patch in PATCHES:
    for seed in SEEDS:
      runs.append(run(patch=patch, attention="softmax", seed=seed))
      runs += [run(patch=patch, attention=activation, alpha=alpha, seed=seed)
               for activation in PAPER_ACTIVATIONS for alpha in ALPHAS
               if seed == 0 or alpha in SEEDED_ALPHAS]
  return runs


def fig3() -> list[Run]:
  """relu and relu2 over ALPHAS with and without qk-layernorm at both lengths, seed 0."""
  return GRID.ablation("qk_norm", ALPHAS, patch=PATCHES)


def fig4() -> list[Run]:
  """relu and relu2 over ALPHAS with and without the attention gate at both lengths, seed 0."""
  return GRID.ablation("gated", ALPHAS, patch=PATCHES)


SWEEPS = {"fig1": fig1, "fig2": fig2, "fig3": fig3, "fig4": fig4}

# The study's order: (sweep, {argument: value or tuple of values}) selects that sweep's runs.
# Cheap and most telling first, so that a study stopped early has whole figures at L = 49
# before anything at L = 196: Figure 1 at seed 0, the seeds of its small models (the first
# measure of seed noise), Figure 2's alpha curves of every activation at alpha 0, 1, 2, then at
# 0.5 and 1.5, Figures 3 and 4 (qk-LN, gate off) at those five alphas, all seeds of Figure 1 and
# of alpha 0 and 1, then the rest; then the same at L = 196 (~6x the cost per run): relu's
# seeds at alpha 0 and 1 and softmax's first (the paper's central claim at the longer sequence),
# then the five first alphas of Figures 2 to 4, the seeds of alpha 0 and 1 one activation at a
# time (whole 3-seed groups first: they decide whether alpha 1's deficit to alpha 0 is beyond
# seed noise), then the other alphas, relu6's last.
PHASES: tuple[plans.Phase, ...] = (
    ("fig1", {"seed": 0}),
    ("fig1", {"size": ("Ti", "S")}),
    ("fig2", {"patch": 4, "seed": 0, "alpha": FIRST_ALPHAS[::2]}),
    ("fig2", {"patch": 4, "seed": 0, "alpha": FIRST_ALPHAS[1::2]}),
    ("fig3", {"patch": 4, "alpha": FIRST_ALPHAS}),
    ("fig4", {"patch": 4, "alpha": FIRST_ALPHAS}),
    ("fig1", {}),
    ("fig2", {"patch": 4, "alpha": SEEDED_ALPHAS}),
    ("fig2", {"patch": 4}),
    ("fig3", {"patch": 4}),
    ("fig4", {"patch": 4}),
    ("fig2", {"patch": 2, "attention": ("softmax", "relu"), "alpha": SEEDED_ALPHAS}),
    ("fig2", {"patch": 2, "seed": 0, "alpha": FIRST_ALPHAS}),
    ("fig3", {"patch": 2, "alpha": FIRST_ALPHAS}),
    ("fig4", {"patch": 2, "alpha": FIRST_ALPHAS}),
    *(("fig2", {"patch": 2, "attention": activation, "alpha": SEEDED_ALPHAS})
      for activation in SEEDED_ACTIVATIONS_ORDER),
    ("fig2", {"patch": 2, "attention": tuple(
        activation for activation in ("relu", *SEEDED_ACTIVATIONS_ORDER)
        if activation != RELU_TWIN)}),
    ("fig3", {"patch": 2}),
    ("fig4", {"patch": 2}),
    ("fig2", {"patch": 2}),
)

PLAN = plans.Plan(
    name="repro", sweeps=SWEEPS, phases=PHASES, figure=FIGURE, datasets=("mnist5k", "digits"),
    docs="docs/reproduction", figures=tuple(SWEEPS),
    pinned=False)  # it finished before studies were pinned
