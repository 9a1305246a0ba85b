"""The Fashion-MNIST study (docs/reproduction.md 1): the paper's claims at L = 196 and 49 on a
small ViT, seeds 0-2, judged by rules fixed in advance. Finished: 79 runs in results/fmnist.

- `protocol`: the grid, the sweeps (configs/study/*.py list them), the run order, the claims;
- `rules`: the decision rules, on numbers alone;
- `results`: the archived runs as the report reads them;
- `recipe`: the recipe's calibration and convergence rules, and the gate they set;
- `report`: the verdicts (`bash launch/study.sh fmnist report`).
"""
from big_vision_relu.experiments import plans
from big_vision_relu.experiments.studies.fmnist import protocol, recipe

PLAN = plans.Plan(
    name="fmnist", sweeps=protocol.SWEEPS, phases=protocol.PHASES, figure=protocol.FIGURE,
    datasets=("mnist5k", "digits", "fashion_mnist_local"),
    data_packages=("dataset-fashion-mnist",), docs="docs/fmnist",
    figures=("fig1", "fig2", "fig3", "fig4"), gate=recipe.gate,
    report="big_vision_relu.experiments.studies.fmnist.report")
