"""The attention statistics against hand-computed values, and the module's place in the layers:
pure functions of arrays, below the run layer and the entry points."""
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from big_vision_relu.evaluators import attention_statistics as stats

from conftest import ROOT

# A 2x2 patch grid (4 tokens, no class token); positions 0:(0,0) 1:(0,1) 2:(1,0) 3:(1,1).
HAND = np.array([[0.5, 0.5, 0.0, 0.0],    # two keys: entropy ln 2; distance .5*0 + .5*1
                 [1.0, 0.0, 0.0, 0.0],    # one key: entropy 0; distance |(0,1)-(0,0)| = 1
                 [0.0, 0.0, 0.0, 0.0],    # dead row: no entropy, no distance
                 [0.25, 0.25, 0.25, 0.25]])  # uniform: ln 4; (sqrt2 + 1 + 1 + 0) / 4


# ------------------------------------------------------------------ statistics by hand

def test_statistics_of_a_known_matrix():
  (row,) = stats.attention_statistics([HAND[None, None]])
  assert row["layer"] == 0
  assert row["zeros"] == 9 / 16
  assert row["negatives"] == 0
  assert row["dead_rows"] == 1 / 4
  assert row["row_sum_mean"] == pytest.approx(3 / 4)
  assert row["row_sum_min"] == 0 and row["row_sum_max"] == 1 and row["row_sum_p50"] == 1
  assert row["row_sum_std"] == pytest.approx(np.std([1, 1, 0, 1]))
  assert row["entropy"] == pytest.approx((math.log(2) + 0 + math.log(4)) / 3)
  assert row["distance"] == pytest.approx((0.5 + 1 + (math.sqrt(2) + 2) / 4) / 3)


def test_entropy_and_distance_use_row_normalised_magnitudes():
  # Scaling a row (relu/L vs softmax) or flipping signs (gelu, identity) changes neither.
  scaled = np.array([[[[0.0, 3.0, -3.0, 0.0]] * 4]])
  (row,) = stats.attention_statistics([scaled])
  assert row["entropy"] == pytest.approx(math.log(2))
  assert row["negatives"] == 1 / 4 and row["zeros"] == 2 / 4
  assert row["row_sum_mean"] == 0
  # queries 0..3 attend to keys 1, 2 equally: distances (1+1)/2, (0+sqrt2)/2, (sqrt2+0)/2, 1.
  assert row["distance"] == pytest.approx((1 + 2 * math.sqrt(2) / 2 + 1) / 4)


def test_class_token_is_excluded_from_the_distance():
  patches = HAND / np.maximum(HAND.sum(-1, keepdims=True), 1)
  with_cls = np.zeros((5, 5))
  with_cls[1:, 1:] = patches
  with_cls[1:, 0] = 7.0  # attention to the class token: ignored by the distance
  with_cls[0] = [0, 0, 0, 0, 1.0]  # the class token's own row: not a patch query
  (row,) = stats.attention_statistics([with_cls[None, None]], (2, 2), 1)
  (expected,) = stats.attention_statistics([patches[None, None]])
  assert row["distance"] == pytest.approx(expected["distance"])
  assert row["dead_rows"] == 0  # every row has mass (the class token's included)
  # The layout is inferred: 5 tokens = a 2x2 grid + 1.
  assert stats.attention_statistics([with_cls[None, None]])[0] == row


def test_statistics_by_head_and_over_images():
  uniform = np.full((4, 4), 0.25)
  weights = np.stack([np.stack([HAND, uniform]), np.stack([uniform, uniform])])  # [2, 2, 4, 4]
  by_head = stats.attention_statistics([weights], by_head=True)
  assert [(r["layer"], r["head"]) for r in by_head] == [(0, 0), (0, 1)]
  assert by_head[0]["zeros"] == 9 / 32  # head 0: HAND (9 zeros) + uniform (0) over 2 images
  assert by_head[1]["zeros"] == 0
  assert by_head[1]["entropy"] == pytest.approx(math.log(4))
  (overall,) = stats.attention_statistics([weights])
  assert overall["zeros"] == 9 / 64
  assert overall["dead_rows"] == 1 / 16


def test_row_statistics_in_jax_equal_numpy():
  rng = np.random.default_rng(0)
  weights = np.maximum(rng.normal(size=(3, 2, 17, 17)), 0) / 17  # 4x4 grid + class token
  expected = stats.row_statistics(weights)
  got = jax.jit(stats.row_statistics)(jnp.asarray(weights, jnp.float32))
  for name, value in expected.items():
    np.testing.assert_allclose(np.asarray(got[name]), value, rtol=1e-5, atol=1e-6,
                               err_msg=name)


def test_layout_inference():
  assert stats.infer_layout(49) == stats.TokenLayout((7, 7), 0)
  assert stats.infer_layout(50) == stats.TokenLayout((7, 7), 1)
  assert stats.infer_layout(12, (3, 4)) == stats.TokenLayout((3, 4), 0)
  with pytest.raises(ValueError, match="square patch grid"):
    stats.infer_layout(12)
  with pytest.raises(ValueError, match="do not fit"):
    stats.infer_layout(12, (3, 3), 0)


def test_qk_logit_norms_by_hand():
  queries = np.zeros((1, 2, 1, 4))
  queries[0, 0, 0] = [3, 4, 0, 0]  # norm 5
  keys = np.zeros((1, 2, 1, 4))
  keys[0, 1, 0] = [0, 2, 0, 0]  # norm 2
  (row,) = stats.qk_logit_norms([queries], [keys])
  assert row["query_norm_mean"] == 2.5 and row["query_norm_max"] == 5
  assert row["key_norm_mean"] == 1 and row["key_norm_max"] == 2
  assert row["logit_max_abs"] == 4 * 2 / math.sqrt(4)  # q0.k1 / sqrt(head_dim)
  assert row["logit_mean"] == pytest.approx(4 / 4)  # one non-zero logit of 4


def test_attention_shares_by_hand():
  branch = np.array([[[3.0, 4.0], [0.0, 0.0]]])  # [1 image, 2 tokens, width 2]: norms 5, 0
  stream = np.array([[[0.0, 10.0], [1.0, 0.0]]])  # norms 10, 1
  assert stats.attention_shares([branch, 2 * branch], [stream, stream]) == [
      {"layer": 0, "attention_to_residual": (0.5 + 0.0) / 2},
      {"layer": 1, "attention_to_residual": (1.0 + 0.0) / 2}]


def test_received_attention():
  grid = stats.received_attention(np.stack([HAND, HAND])[None], (2, 2), 0)  # 2 heads
  # Live rows' normalised weights: [.5,.5,0,0], [1,0,0,0], [.25]*4, averaged over 3 rows.
  np.testing.assert_allclose(grid[0].ravel(), [1.75 / 3, 0.75 / 3, 0.25 / 3, 0.25 / 3])


def test_imports_nothing_above_the_evaluators():
  # A fresh interpreter: this test process has imported everything already.
  code = ("import sys, big_vision_relu.evaluators.attention_statistics, "
          "big_vision_relu.evaluators.attention_capture; print(' '.join(sys.modules))")
  loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True, cwd=ROOT).stdout.split()
  above = {f"big_vision_relu.{name}" for name in ("inspect", "run", "train", "evaluate")}
  assert "big_vision_relu.evaluators.attention_statistics" in loaded
  assert not above & set(loaded)
