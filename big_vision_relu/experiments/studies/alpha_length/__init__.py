"""Why L^-1? The best alpha as a function of the sequence length (docs/alpha_length.md).

- `protocol`: the pre-registered grid, run order and analysis (fixed before the study's first
  run: change only by appending to docs/alpha_length.md, with the date);
- `report`: results.md and the figures, redrawn from the archive (`bash launch/study.sh
  alpha_length report`; its PLAN.report).
"""
from big_vision_relu.experiments import plans
from big_vision_relu.experiments.studies.alpha_length import protocol
from big_vision_relu.experiments.sweep import Run


def grid() -> list[Run]:
  """Every run of the study: each length's runs (`protocol.runs`), L = 16, then 49, then 196."""
  return [run for patch in protocol.PATCH_TO_LENGTH for run in protocol.runs(patch)]


PLAN = plans.Plan(
    name="alpha_length", sweeps={protocol.SWEEP: grid}, phases=protocol.PHASES,
    datasets=("mnist5k", "digits", "fashion_mnist_local"),
    data_packages=("dataset-fashion-mnist",), docs="docs/alpha_length",
    report="big_vision_relu.experiments.studies.alpha_length.report")
