r"""Figure 2 on Fashion-MNIST at L = 196: test accuracy against alpha for relu and relu2 (alpha
0, 0.5, 1, 1.5, 2), gelu, softplus, sigmoid and identity (alpha 0 and 1), and softmax; qk-LN on.
Seeds 0-2 for softmax, relu at alpha 0 and 1 (phase A) and relu2 at alpha 0 and 1; seed 0
elsewhere.

    python -m big_vision_relu.experiments.sweep configs/study/fig2.py --list
"""
from big_vision_relu.experiments import fmnist
from big_vision_relu.experiments.sweep import Run

FIGURE = fmnist.FIGURE


def get_sweep() -> list[Run]:
  runs = fmnist.phase_a()
  runs += [fmnist.run(attention=a, alpha=alpha) for a in ("relu", "relu2")
           for alpha in fmnist.ALPHAS if (a, alpha) not in (("relu", 0.0), ("relu", 1.0))]
  runs += fmnist.later_seed_alpha_pairs(attention="relu2")
  runs += [fmnist.run(attention=a, alpha=alpha) for a in fmnist.OTHER_ACTIVATIONS
           for alpha in (0.0, 1.0)]
  return runs
