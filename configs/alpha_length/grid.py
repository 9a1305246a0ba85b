r"""The alpha-length study's runs (docs/alpha_length.md; `experiments.studies.alpha_length`):
relu with qk-LN over an alpha grid, softmax and attention off (`attention=zero`) at L = 16, 49
and 196 (patch 7, 4, 2), seeds 0-2, 40 epochs on the 55,000 training images left after a
5,000-image validation split.

    python -m big_vision_relu.experiments.sweep configs/alpha_length/grid.py --list
    bash launch/study.sh alpha_length          # trains them all, in the study's order

Expected: one run costs ~0.5 (L = 16), ~1.3 (L = 49) and ~5.8 (L = 196) CPU core hours
(estimated from the Fashion-MNIST study's runs at L = 49 and 196); results in
docs/alpha_length.md once archived.
"""
from big_vision_relu.experiments.studies import alpha_length
from big_vision_relu.experiments.sweep import Run


def get_sweep() -> list[Run]:
  return alpha_length.grid()
