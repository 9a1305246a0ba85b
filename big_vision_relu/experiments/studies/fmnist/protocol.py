"""The Fashion-MNIST study's grid, sweeps, run order and claims (docs/reproduction.md; the
sweep files configs/study/*.py list the sweeps).

Every run uses configs/study/fmnist_vit.py with all its study arguments spelled out in one
order, so a run shared by several figures has one run id and is trained once. Phases follow
the issue's plan: a partial study answers the main question first, and the runs a claim
(`CLAIMS`, judged by `studies.fmnist.report`) needs come before those that only draw a
figure.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from big_vision_relu.experiments import plans
from big_vision_relu.experiments.studies.fmnist import rules as decision_rules
from big_vision_relu.experiments.sweep import FigureSpec, Grid, Run

CONFIG = "configs/study/fmnist_vit.py"
BASE_LR = 1e-3  # CONFIG's own peak lr: runs at it keep ids without an lr (`Grid.implicit`)
# The recipe's calibration points (epochs, peak lr), each run for softmax and relu/L at seed 0
# (docs/reproduction.md 1.2): 10 and 20 epochs at BASE_LR, then (its rule D2) 20 epochs at
# 2e-3. The recipe (EPOCHS, LR) is one of them; the others are the calibration phase's runs.
CALIBRATION = ((10, BASE_LR), (20, BASE_LR), (20, 2e-3))
EPOCHS = 20  # the recipe's length (configs/study/fmnist_vit.py's `epochs`)
LR = BASE_LR  # the recipe's peak lr, as rule D2 picks it (fmnist_report --check_calibration)
SEEDS = (0, 1, 2)
HELD_OUT_SEED = 3  # retrained once phase A is done: must land inside its arm's seed spread
ALPHAS = (0.0, 0.5, 1.0, 1.5, 2.0)  # Figure 2's grid
ABLATION_ALPHAS = (0.0, 1.0, 1.5)  # Figures 3 and 4
SIZES = ("Ti", "S", "B")  # Figure 1, at L = 49
OTHER_ACTIVATIONS = ("gelu", "softplus", "sigmoid", "identity")  # alpha 0 and 1 only
GRID = Grid(CONFIG, dict(size="Ti", patch=2, attention="relu", alpha=1.0, qk_norm=True,
                         gated=False, epochs=EPOCHS, seed=0, lr=LR), implicit={"lr": BASE_LR})

FIGURE = FigureSpec(
    accuracy_metric="test/prec@1", accuracy_label="Fashion-MNIST test accuracy",
    fewshot_metric="fewshot/10shot_avg", fewshot_label="10-shot transfer (mnist5k, digits)",
    core_hours_label="CPU core hours", panel_key="patch",
    panel_title="Fashion-MNIST, patch {value}", size_key="size")


def run(**args: Any) -> Run:
  """A run of the study: `args` override the defaults (Ti, patch 2, relu, alpha 1, qk-LN on,
  no gate, EPOCHS, seed 0, LR)."""
  return GRID.run(**args)


def phase_a(epochs: int = EPOCHS) -> list[Run]:
  """L = 196: softmax, relu/L (alpha 1) and relu (alpha 0), 3 seeds each, trained for `epochs`;
  seed 0 first."""
  return [run(attention=attention, alpha=alpha, seed=seed, epochs=epochs) for seed in SEEDS
          for attention, alpha in (("softmax", 1.0), ("relu", 1.0), ("relu", 0.0))]


def calibration() -> list[Run]:
  """The recipe's calibration runs: softmax and relu/L at seed 0 at every CALIBRATION point
  but the recipe's own (whose runs are phase A's seed-0 runs)."""
  return [run(attention=attention, epochs=epochs, lr=lr) for epochs, lr in CALIBRATION
          if (epochs, lr) != (EPOCHS, LR) for attention in ("softmax", "relu")]


def later_seed_alpha_pairs(**args: Any) -> list[Run]:
  """Seeds 1-2 of a paired alpha row (alpha 1 - alpha 0; seed 0 is in the sweep already), a
  seed's alpha 0 and 1 next to each other, so that pair trains on one machine (see fig1.py)."""
  return [run(**args, alpha=alpha, seed=seed) for seed in SEEDS[1:] for alpha in (0.0, 1.0)]


def twice_as_long(epochs: int = EPOCHS) -> list[Run]:
  """Seed 0's softmax and relu/L (alpha 1) trained for 2 x `epochs`: rule (c)'s check of a
  recipe of `epochs` (for EPOCHS, the calibration measured 10 -> 20, one doubling short)."""
  return [run(attention=attention, epochs=2 * epochs) for attention in ("softmax", "relu")]


CANDIDATE_EPOCHS = 2 * EPOCHS  # rule E1's candidate recipe (docs/reproduction.md 1.2)


def candidate() -> list[Run]:
  """Rule E2: phase A at CANDIDATE_EPOCHS (its seed-0 softmax and relu/L are `twice_as_long`'s
  runs), then the candidate's own seed-0 pair at twice its length, its rule (c)."""
  return phase_a(CANDIDATE_EPOCHS) + twice_as_long(CANDIDATE_EPOCHS)


def held_out() -> list[Run]:
  """relu/L at L = 196 with a seed none of the comparisons uses."""
  return [run(attention="relu", seed=HELD_OUT_SEED)]


def calibration_sweep() -> list[Run]:
  """The calibration runs and phase A's seed-0 softmax and relu/L, the recipe's own point."""
  return [*calibration(), *(r for r in phase_a() if r.args["seed"] == 0
                            and r.args["alpha"] == 1.0)]


def fig1() -> list[Run]:
  """Figure 1 at L = 49: softmax and relu/L for each size, 3 seeds. A seed's softmax and relu/L
  next to each other: the study's two workers start them together or one after the other, so
  a pair trains on one machine (docs/reproduction.md 1.4)."""
  return [run(size=size, patch=4, attention=a, seed=seed) for size in SIZES
          for seed in SEEDS for a in ("softmax", "relu")]


def fig2() -> list[Run]:
  """Figure 2 at L = 196: phase A, relu and relu2 over ALPHAS, relu2's seeds 1-2 at alpha 0
  and 1, the other activations at alpha 0 and 1."""
  runs = phase_a()
  runs += [run(attention=a, alpha=alpha) for a in ("relu", "relu2")
           for alpha in ALPHAS if (a, alpha) not in (("relu", 0.0), ("relu", 1.0))]
  runs += later_seed_alpha_pairs(attention="relu2")
  runs += [run(attention=a, alpha=alpha) for a in OTHER_ACTIVATIONS for alpha in (0.0, 1.0)]
  return runs


def fig3() -> list[Run]:
  """Figure 3: relu and relu2 at ABLATION_ALPHAS with and without qk-layernorm, seed 0."""
  return GRID.ablation("qk_norm", ABLATION_ALPHAS)


def fig4() -> list[Run]:
  """Figure 4: relu and relu2 at ABLATION_ALPHAS with and without the gate, seed 0; relu2's
  gated alpha 0 and 1 at seeds 1-2 too."""
  return (GRID.ablation("gated", ABLATION_ALPHAS)
          + later_seed_alpha_pairs(attention="relu2", gated=True))


SWEEPS: plans.Sweeps = {"calibration": calibration_sweep, "held_out": held_out, "fig1": fig1,
                        "fig2": fig2, "fig3": fig3, "fig4": fig4,
                        "twice_as_long": twice_as_long, "candidate": candidate}


# (sweep, {argument: value or tuple of values}), as `plans.plan` reads them.
# Calibration's base runs are phase A's seed-0 runs; their 2x twins come right after.
PHASES: tuple[plans.Phase, ...] = (
    ("fig2", {"attention": ("softmax", "relu"), "alpha": 1.0, "seed": 0}),
    ("calibration", {}),
    ("fig2", {"attention": ("softmax", "relu"), "alpha": (0.0, 1.0)}),
    ("held_out", {}),
    # D (Figure 1, the paper's headline; ~5x cheaper per image at L = 49) before B and C, as
    # docs/reproduction.md 1.4 planned once the calibration had doubled every run's cost.
    ("fig1", {}),
    # B and C, the runs a claim of docs/reproduction.md 1.2 needs first (written in the study's
    # eighth session, before phase A had finished and before any B or C run existed): the
    # single-seed rows at alpha 0 and 1 (relu2's alpha pair, identity, qk-LN off, gate on),
    # then relu2's seeds 1-2 (its paired alpha row), then alpha 1.5's qk-LN rows.
    ("fig2", {"attention": "relu2", "alpha": (0.0, 1.0), "seed": 0}),
    ("fig2", {"attention": "identity", "alpha": 1.0}),
    ("fig3", {"alpha": (0.0, 1.0)}),
    ("fig4", {"alpha": (0.0, 1.0), "seed": 0}),
    ("fig2", {"attention": "relu2", "alpha": (0.0, 1.0)}),
    ("fig3", {}),
    # Added in the study's twenty-sixth session, before any of its runs existed (1.2): relu2's
    # gated alpha pair at seeds 1-2, so the gate row for relu2 is also judged paired.
    ("fig4", {"attention": "relu2", "gated": True, "seed": (1, 2)}),
    # Last, the runs no claim needs (Figures 2 and 4 drawn in full): the first to be cut.
    ("fig2", {}),
    ("fig4", {}),
    # Added in session 52 (the study's fortieth), after the 68 runs above had finished and
    # before any 40-epoch run existed (docs/reproduction.md 1.2, "The recipe trained twice as
    # long"): rule (c) on the recipe itself, which D1 had left out for its cost.
    ("twice_as_long", {}),
    # Added in session 54 (the study's forty-second), once phase 14 had met rule E1 (1.2, "If
    # the recipe stays short of (b)"), as its rule E2 orders: phase A's other seven runs at the
    # candidate's 40 epochs, then its seed-0 pair at 80.
    ("candidate", {"epochs": CANDIDATE_EPOCHS}),
    ("candidate", {"epochs": 2 * CANDIDATE_EPOCHS}),
)
# The recipe's calibration (phase 0's runs at the recipe, phase 1's at the other points): until
# its rules (docs/reproduction.md 1.2) accept the recipe, the study runs only these (its gate).
CALIBRATION_PHASES = (0, 1)


@dataclasses.dataclass(frozen=True)
class Claim:
  """A claim of the paper as docs/reproduction.md 1.2 judges it: Delta = arm `a` (the one the
  paper favours) - arm `b`, each given by its run arguments but the seed (`run`'s defaults
  for the rest), by `rule`: "paired" over seeds (`decision_rules.verdict` at `margin`: 1 point,
  "a at most 1 point worse than b"; 0, "a better than b"), or seed 0 alone against phase A's
  seed noise, "favours" (a better than b) or "little_effect" (a and b differ little)."""
  text: str
  a: dict[str, Any]
  b: dict[str, Any]
  rule: str = "paired"
  margin: float = decision_rules.MARGIN

  def at_epochs(self, epochs: int) -> Claim:
    """The same claim judged on both arms' runs of `epochs` epochs."""
    return dataclasses.replace(self, text=f"{self.text} at {epochs} epochs",
                               a=dict(self.a, epochs=epochs), b=dict(self.b, epochs=epochs))


PHASE_A_ARMS = (dict(attention="softmax"), dict(attention="relu", alpha=1.0),
                dict(attention="relu", alpha=0.0))
CLAIMS = (
    Claim("relu/L approaches or matches softmax (Fig. 1, Ti, L = 196)",
          dict(attention="relu", alpha=1.0), dict(attention="softmax")),
    *(Claim(f"relu/L approaches or matches softmax (Fig. 1, {size}, L = 49)",
            dict(size=size, patch=4, attention="relu", alpha=1.0),
            dict(size=size, patch=4, attention="softmax")) for size in SIZES),
    *(Claim(f"alpha 1 at least as good as alpha 0 (Fig. 2, {attention})",
            dict(attention=attention, alpha=1.0), dict(attention=attention, alpha=0.0))
      for attention in ("relu", "relu2")),
    Claim("removing the activation hurts (Fig. 2)", dict(attention="relu", alpha=1.0),
          dict(attention="identity", alpha=1.0), "favours"),
    *(Claim(f"qk-LayerNorm has little effect (Fig. 3, {attention}, alpha {alpha:g})",
            dict(attention=attention, alpha=alpha, qk_norm=True),
            dict(attention=attention, alpha=alpha, qk_norm=False), "little_effect")
      for attention in ("relu", "relu2") for alpha in ABLATION_ALPHAS),
    *(Claim(f"the gate does not remove the need for L scaling (Fig. 4, {attention})",
            dict(attention=attention, alpha=1.0, gated=True),
            dict(attention=attention, alpha=0.0, gated=True), "favours")
      for attention in ("relu", "relu2")),
    # Added in the twenty-sixth session, before its seed 1-2 runs existed (docs/reproduction.md
    # 1.2): the row above, paired over seeds 0-2, "a better than b" as its rule asks (m = 0).
    Claim("the gate does not remove the need for L scaling (Fig. 4, relu2, seeds 0-2, m = 0)",
          dict(attention="relu2", alpha=1.0, gated=True),
          dict(attention="relu2", alpha=0.0, gated=True), margin=0.0),
)
# Rule E2 (1.2): the claims between phase A's arms again, on their runs at the candidate's length.
CLAIMS += tuple(claim.at_epochs(CANDIDATE_EPOCHS) for claim in CLAIMS
                if claim.a in PHASE_A_ARMS and claim.b in PHASE_A_ARMS)
