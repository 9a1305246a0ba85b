"""docs/reproduction.md's "What the Fashion-MNIST study supports" recomputes: tools/fmnist_reread.py
prints, from the finished study's archive, each number that section states (the pairs below:
what the tool prints, what the doc says)."""
import subprocess
import sys

from conftest import ROOT

PAIRS = [
    ("20 epochs, seeds 0-2: -0.02 (SE 0.12)", "-0.02 (SE 0.12) at 20 epochs"),
    ("40 epochs, seeds 0-2: +0.62 (SE 0.18)", "+0.62 (SE 0.18) at 40"),
    ("80 epochs, seed 0: +0.90", "+0.90 at 80 (seed 0"),
    ("over 16 pairs: -0.684; without the 80-epoch pair: -0.771",
     "r = -0.68 (-0.77 without the 80-epoch pair)"),
    ("alpha 1 - alpha 0 at 20 epochs: +2.29 (SE 0.12)", "+2.29 (SE 0.12) at 20"),
    ("alpha 1 - alpha 0 at 40 epochs: +1.51 (SE 0.04)", "+1.51 (SE 0.04) at 40"),
    ("alpha 0, 20 -> 40 epochs: +1.93 (seeds: +2.23, +1.90, +1.67)",
     "alpha 0 gains +1.93 from 20 to 40 epochs (seeds +2.23, +1.90, +1.67)"),
    ("relu: 0 0.8721, 0.5 0.8856, 1 0.8974, 1.5 0.9042, 2 0.9024; alpha 1.5 - alpha 1 +0.68",
     "relu: alpha 1 0.8974, 1.5 0.9042 (+0.68), 2 0.9024 (+0.50)"),
    ("raw pixels 0.783; the 79 trained runs: final 0.387 to 0.528, highest at any evaluation 0.539",
     "raw pixels 0.783; every trained run <= 0.539 at any evaluation (final 0.387-0.528)"),
    ("80 epochs: final test loss 0.592, accuracy 0.8978 (-0.48 from 40 epochs), best 0.9028 at "
     "epoch 50", "its best evaluation,\n  0.9028, at epoch 50"),
    ("0.8979 against 0.8964 to 0.9010", "relu/L seed 3: 0.8979, against 0.8964-0.9010"),
    ("relu/L: Ti 0.9071, S 0.9098, B 0.9113; B - Ti +0.42", "softmax +0.22, relu/L +0.42 points"),
]


def test_the_documented_numbers_recompute_from_the_archive():
  printed = subprocess.run([sys.executable, str(ROOT / "tools" / "fmnist_reread.py")],
                           cwd=ROOT, capture_output=True, text=True, check=True,
                           timeout=300).stdout
  doc = (ROOT / "docs" / "reproduction.md").read_text()
  for tool_says, doc_says in PAIRS:
    assert tool_says in printed, tool_says
    assert doc_says in doc, doc_says
