"""Inspection: the notebook front end's names, the sown weights against the attention maths,
the attention_stats evaluator against the full statistics, and the notebook executed headlessly
on a workdir trained here (the statistics by hand: test_attention_statistics.py)."""
import csv
import json
import math
import os
import pathlib
import shutil
import sys

import jax
import jax.numpy as jnp
import matplotlib.image
import numpy as np
import pytest
from flax import traverse_util

from big_vision_relu import checkpoint as checkpoint_lib
from big_vision_relu import inspect
from big_vision_relu import sharding
from big_vision_relu import train as train_lib
from big_vision_relu.evaluators import attention_capture
from big_vision_relu.evaluators import attention_statistics
from big_vision_relu.evaluators import registry
from big_vision_relu.evaluators.attention_stats import AttentionStatsEvaluator
from big_vision_relu.models import attention as attn
from big_vision_relu.models import vit

from conftest import ROOT
from trainer_processes import tiny_config

PP = 'decode(channels=1)|value_range(-1, 1)|onehot(10)|keep("image", "labels")'


def test_front_end_names_are_the_shared_ones():
  assert all(hasattr(inspect, name) for name in inspect.__all__)
  assert inspect.row_statistics is attention_statistics.row_statistics
  assert inspect.apply_inspecting is attention_capture.apply_inspecting


# ------------------------------------------------------------------ the model's weights

def _model_and_images(scan: bool, **kw):
  model = vit.Model(10, variant="mu/4", depth=2, scan=scan, **kw)
  images = jax.random.normal(jax.random.PRNGKey(1), (3, 12, 12, 1))
  params = model.init(jax.random.PRNGKey(0), images)["params"]
  return model, params, np.asarray(images)


@pytest.mark.parametrize("activation", ["relu", "softmax", "gelu"])
def test_sown_weights_are_the_attention_of_the_captured_queries_and_keys(activation):
  model, params, images = _model_and_images(False, attention=activation, qk_norm=True,
                                            pool_type="tok", seqlen_alpha=0.5)
  out = inspect.run_model(inspect.Run(model, params, None, None, "mem"), images, batch_size=2)
  assert out.grid_shape == (3, 3) and out.num_prefix_tokens == 1
  assert [w.shape for w in out.weights] == [(3, 2, 10, 10)] * 2  # [n, heads, 1 + 9, 1 + 9]
  for weights, queries, keys in zip(out.weights, out.queries, out.keys):
    expected = attn.attention_weights(jnp.asarray(queries), jnp.asarray(keys),
                                      activation=activation, seqlen_alpha=0.5)
    np.testing.assert_allclose(weights, expected, rtol=1e-5, atol=1e-6)
  logits, _ = model.apply({"params": params}, images)
  np.testing.assert_allclose(out.logits, logits, rtol=1e-6)  # inspecting changes nothing


@pytest.mark.parametrize("scan", [False, True])
def test_attention_share_is_the_attention_branch(scan):
  # The out projection's kernel and bias scale the attention branch and nothing before it.
  model, params, images = _model_and_images(scan, attention="relu", qk_norm=True)
  block = "encoderblock" if scan else "encoderblock_0"
  projection = ("Transformer", block, "MultiHeadDotProductAttention_0", "out")
  scaled = {}
  for factor in (0.0, 1.0, 2.0):
    flat = traverse_util.flatten_dict(params)
    for name in ("kernel", "bias"):  # with scan: every layer's (leading depth axis)
      flat[(*projection, name)] = factor * flat[(*projection, name)]
    run = inspect.Run(model, traverse_util.unflatten_dict(flat), None, None, "mem")
    scaled[factor] = inspect.run_model(run, images)
  shares = {factor: [row["attention_to_residual"] for row in
                     inspect.attention_shares(out.attention_outputs, out.block_inputs)]
            for factor, out in scaled.items()}
  plain = scaled[1.0]
  assert [a.shape for a in plain.attention_outputs] == [(3, 9, 32)] * 2  # [n, 3x3, width]
  assert all(share > 0 for share in shares[1.0])
  assert shares[0.0][0] == 0
  assert shares[2.0][0] == pytest.approx(2 * shares[1.0][0], rel=1e-5)
  np.testing.assert_allclose(scaled[2.0].block_inputs[0], plain.block_inputs[0], rtol=1e-5,
                             atol=1e-6)  # layer 0's input: the embedded patches, unchanged


def test_sowing_keeps_the_parameter_tree():
  model, params, images = _model_and_images(True, attention="relu")
  sowing = jax.eval_shape(model.clone(sow_attention_weights=True).init, jax.random.PRNGKey(0),
                          images)
  assert list(sowing) == ["params"]
  assert jax.tree.map(jnp.shape, sowing["params"]) == jax.tree.map(jnp.shape, params)


def test_scan_and_npz_give_the_same_maps_as_per_layer(tmp_path):
  model, params, images = _model_and_images(False, attention="relu", qk_norm=True)
  path = str(tmp_path / "vit.npz")
  vit.save_npz(params, path)
  model_config = dict(variant="mu/4", depth=2, attention="relu", qk_norm=True)
  per_layer = inspect.attention_maps(inspect.Run(model, params, None, None, "mem"), images)
  scanned = inspect.load_npz(path, {**model_config, "scan": True})
  assert scanned.model.num_classes == 10  # read from the file's head
  assert "encoderblock" in scanned.params["Transformer"]
  got = inspect.attention_maps(scanned, images)
  assert len(got) == 2
  for a, b in zip(got, per_layer):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------ the evaluator

@pytest.mark.parametrize("scan,pool_type", [(False, "gap"), (True, "tok")])
def test_evaluator_equals_the_full_statistics(offline_data_dir, scan, pool_type):
  model = vit.Model(10, variant="mu/7", depth=2, scan=scan, pool_type=pool_type,
                    attention="relu", qk_norm=True)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))["params"]
  data = dict(name="mnist5k", split="test", data_dir=offline_data_dir)
  config = dict(type="attention_stats", data=data, pp_fn=PP, batch_size=8, num_examples=20)
  # Built as the trainer builds it: the registry hands it the model.
  evaluator, = registry.from_config(
      {"attention": config}, model=model, mesh=sharding.make_mesh([("data", -1)]),
      data_axis="data", pipeline="tfds", total_steps=1, steps_per_epoch=1.0, train_batch_size=8,
      default_loss="sigmoid_xent")
  got = evaluator.run(params)
  assert got["num_examples"] == 24  # 20 rounded up to whole batches of 8
  images, _ = inspect.eval_examples(inspect.Run(model, params, None, None, "mem"), 24,
                                    data=data, pp=PP)
  # The notebook's per-layer table (numpy, float64) of the same 24 examples.
  expected = inspect.layer_table(inspect.run_model(inspect.Run(model, params, None, None, "mem"),
                                                   images))
  names = ("zeros", "row_sum_mean", "entropy", "distance", "attention_to_residual")
  for layer, row in enumerate(expected):
    for name in names:
      assert got[f"layer{layer}/{name}"] == pytest.approx(row[name], rel=1e-4), name
  assert set(got) == {"num_examples"} | {f"layer{i}/{n}" for i in range(2) for n in names}


# ------------------------------------------------------------------ end to end: the notebook

NOTEBOOK = ROOT / "notebooks" / "inspect_checkpoint.ipynb"
# A stand-in for Colab's `google.colab` (authenticate_user records that it was called), and the
# cell that imports it first, as Colab's kernel has it imported before any cell runs.
COLAB_AUTH = """import pathlib
CALLS = pathlib.Path(__file__).parent / "authenticate_user.calls"


def authenticate_user():
  with open(CALLS, "a") as f:
    f.write("called\\n")
"""


def _stand_in_colab(tmp_path) -> tuple[str, pathlib.Path]:
  """(first cell's source, the file authenticate_user() appends to)."""
  package = tmp_path / "colab_stand_in" / "google" / "colab"
  package.mkdir(parents=True)
  (package / "__init__.py").write_text("")
  (package / "auth.py").write_text(COLAB_AUTH)
  (package / "output.py").write_text("")  # jax's Colab debugger imports it on import
  first_cell = (f"import sys\nsys.path.insert(0, {str(tmp_path / 'colab_stand_in')!r})\n"
                "import google.colab  # Colab's kernel has it imported")
  return first_cell, package / "authenticate_user.calls"


def _execute_notebook(path, parameters: dict, cwd, timeout: int, first_cell: str | None = None):
  """Runs the notebook with `parameters` appended to its parameter cell (as papermill does),
  after `first_cell` if given."""
  import nbclient
  import nbformat
  notebook = nbformat.read(path, as_version=4)
  cell = next(c for c in notebook.cells if "parameters" in c.metadata.get("tags", []))
  cell.source += "\n" + "\n".join(f"{k} = {v!r}" for k, v in parameters.items())
  if first_cell:
    notebook.cells.insert(0, nbformat.v4.new_code_cell(first_cell))
  nbclient.NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                          resources={"metadata": {"path": str(cwd)}}).execute()
  return notebook


def _read_csv(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def test_a_damaged_newest_step_is_skipped_and_left_on_disk(offline_data_dir, tmp_path, caplog,
                                                          monkeypatch):
  """load_run() reads the step before a truncated newest one, says so, and changes nothing.

  orbax's failed read closes its event loop while tensorstore's other reads of that step are
  still in flight; they finish on tensorstore's threads into the closed loop, which Python
  reports as unraisable `RuntimeError: Event loop is closed` (after the restore has failed, so
  harmless). Those are expected here, and nothing else."""
  workdir = tmp_path / "run"
  train_lib.train(tiny_config(offline_data_dir), str(workdir))  # keeps steps 4 and 6
  data_files = sorted((workdir / "checkpoints" / "6" / "state" / "d").iterdir())
  for data_file in data_files:
    os.truncate(data_file, data_file.stat().st_size // 2)
  sizes = [f.stat().st_size for f in data_files]
  unraisable = []
  with monkeypatch.context() as patch:
    patch.setattr(sys, "unraisablehook", unraisable.append)
    assert inspect.load_run(workdir).step == 4
  assert [(type(u.exc_value), str(u.exc_value)) for u in unraisable] == [
      (RuntimeError, "Event loop is closed")] * len(unraisable)
  assert any("Could not read checkpoint step 6" in r.getMessage() for r in caplog.records)
  assert inspect.checkpoint_steps(workdir) == [4, 6]
  assert [f.stat().st_size for f in data_files] == sizes


@pytest.mark.slow
def test_notebook_and_tool_on_a_trained_workdir(offline_data_dir, tmp_path, monkeypatch,
                                                capsys):
  # Train a 2-layer relu ViT for 6 steps, with the attention_stats evaluator in training.
  monkeypatch.setitem(registry.EVALUATORS, "attention_stats", AttentionStatsEvaluator)
  # As on a TPU VM: the config names no data dir, TFDS_DATA_DIR does (launch/tpu sets it); the
  # trainer records it in the workdir, and the notebook, run without it, must find it there.
  config = tiny_config(offline_data_dir)
  del config.input.data["data_dir"]
  config.model = dict(patch_size=(7, 7), width=16, depth=2, mlp_dim=32, num_heads=2,
                      attention="relu", qk_norm=True)
  data = dict(name="mnist5k", split="test")
  config.evals.test = dict(type="classification", data=data, pp_fn=PP, batch_size=200)
  config.evals.attention = dict(type="attention_stats", data=data, pp_fn=PP, batch_size=16,
                                num_examples=32, log_steps=3)
  relu_dir = tmp_path / "relu"
  monkeypatch.setenv("TFDS_DATA_DIR", offline_data_dir)
  train_lib.train(config, str(relu_dir))
  monkeypatch.delenv("TFDS_DATA_DIR")
  assert json.loads((relu_dir / "data_dir.json").read_text()) == {
      "tfds_data_dir": offline_data_dir}
  logged = [json.loads(line) for line in (relu_dir / "metrics.jsonl").read_text().splitlines()]
  assert [line["step"] for line in logged if "attention/layer1/zeros" in line] == [1, 3, 6]

  run = inspect.load_run(relu_dir)
  assert run.step == 6 and run.model.attention_options.activation == "relu" and run.model.depth == 2
  assert inspect.data_dir(run) == offline_data_dir
  # Only the parameters are read: the same arrays as the full state's, and nothing else.
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  state = checkpoint_lib.read_state(relu_dir / "checkpoints" / "6", device)
  assert set(state) > {"params"}  # the optimizer state is there on disk
  jax.tree.map(np.testing.assert_array_equal, run.params, state["params"])
  assert inspect.load_run(relu_dir, step=4).step == 4
  # The softmax side: the same trained parameters read as a softmax model (the parameter trees
  # are equal), so the notebook's comparison needs no second training run.
  softmax_dir = tmp_path / "softmax"
  shutil.copytree(relu_dir, softmax_dir)
  run_config = json.loads((softmax_dir / "config.json").read_text())
  run_config["model"]["attention"] = "softmax"
  (softmax_dir / "config.json").write_text(json.dumps(run_config))

  # On "Colab" (the stand-in): authenticates, installs nothing (everything is there: pip
  # could not reach an index anyway), reads the recorded data dir; HOME has no datasets.
  out_dir = tmp_path / "out"
  first_cell, auth_calls = _stand_in_colab(tmp_path)
  home = tmp_path / "home"
  home.mkdir()
  monkeypatch.setenv("HOME", str(home))
  monkeypatch.setenv("PIP_NO_INDEX", "1")
  _execute_notebook(NOTEBOOK, dict(WORKDIR=str(relu_dir), OTHER_WORKDIR=str(softmax_dir),
                                   OUTPUT_DIR=str(out_dir), NUM_IMAGES=4, NUM_STATS_IMAGES=16),
                    cwd=tmp_path, timeout=300, first_cell=first_cell)
  assert auth_calls.read_text() == "called\n"
  assert not (home / "tensorflow_datasets").exists()

  summary = json.loads((out_dir / "summary.json").read_text())
  assert summary["data_dir"] == offline_data_dir
  assert {r["attention"]: r["step"] for r in summary["runs"].values()} == {"relu": 6,
                                                                          "softmax": 6}
  for name in ("training_curves", "predictions", "attention_maps", "attention_heads",
               "row_sums", "side_by_side_attention_maps"):
    pixels = matplotlib.image.imread(out_dir / f"{name}.png")
    assert pixels.shape[0] > 200 and pixels.shape[1] > 200, name
    assert pixels[..., :3].std() > 0.05, f"{name}.png is blank"

  # One row per run and layer; the values are those computed here on the same images.
  rows = _read_csv(out_dir / "attention_stats.csv")
  assert [(r["run"], r["layer"]) for r in rows] == [
      ("relu", "0"), ("relu", "1"), ("softmax", "0"), ("softmax", "1")]
  images, _ = inspect.eval_examples(run, 16)
  expected = inspect.layer_table(inspect.run_model(run, images))
  max_distance = math.hypot(3, 3)  # a 4x4 grid of 7x7 patches
  for row, want in zip(rows[:2], expected):
    for name, value in want.items():
      assert float(row[name]) == pytest.approx(value, rel=1e-5, abs=1e-7), name
    assert 0 < float(row["zeros"]) < 1
    assert 0 < float(row["entropy"]) <= math.log(16)
    assert 0 < float(row["distance"]) <= max_distance
  for row in rows[2:]:
    assert float(row["zeros"]) == 0 and float(row["dead_rows"]) == 0
    assert float(row["row_sum_mean"]) == pytest.approx(1, abs=1e-6)
    assert 0 < float(row["entropy"]) <= math.log(16)
  assert len(_read_csv(out_dir / "attention_stats_by_head.csv")) == 2 * 2 * 2
  side_by_side = (out_dir / "side_by_side.csv").read_text().splitlines()
  assert side_by_side[1].startswith("run,relu,softmax,")  # (statistic, run) columns

  # tools/attention_by_run.py: the same statistics, one table row per run.
  monkeypatch.syspath_prepend(str(ROOT / "tools"))
  import attention_by_run  # noqa: PLC0415  (a script of tools/, imported as one)
  running_dir = tmp_path / "running"  # newest checkpoint 4, test accuracy logged at 6
  shutil.copytree(relu_dir, running_dir)
  shutil.rmtree(running_dir / "checkpoints" / "6")
  monkeypatch.setattr("sys.argv", ["attention_by_run.py", str(softmax_dir), str(relu_dir),
                                   str(running_dir), "--num_images", "16",
                                   "--csv", str(tmp_path / "runs.csv")])
  attention_by_run.main()
  printed = capsys.readouterr()
  assert f"skipped {running_dir}: checkpoint step 4, test accuracy logged at step 6" in (
      printed.err)
  table = [line for line in printed.out.splitlines() if line.startswith("| ")]
  accuracy = inspect.read_metrics(relu_dir)["test/prec@1"][1][-1]
  assert [line.split(" | ")[:6] for line in table[1:]] == [  # sorted by attention
      ["| relu", "on", "off", "1", "0", f"{accuracy:.3f}"],
      ["| softmax", "on", "off", "-", "0", f"{accuracy:.3f}"]]
  tool_rows = _read_csv(tmp_path / "runs.csv")
  assert [(r["run"], r["layer"]) for r in tool_rows] == [
      ("relu", "0"), ("relu", "1"), ("softmax", "0"), ("softmax", "1")]
  for row, want in zip(tool_rows[:2], expected):
    for name in ("attention_to_residual", "row_sum_p50", "logit_std"):
      assert float(row[name]) == pytest.approx(want[name], rel=1e-5, abs=1e-7), name
  assert float(tool_rows[2]["row_sum_p50"]) == pytest.approx(1, abs=1e-6)


def _notebook_function(name: str):
  """A function defined in the notebook's install cell (run here without Colab: it installs
  nothing)."""
  import nbformat
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  [cell] = [c for c in notebook.cells if f"def {name}(" in c.source]
  namespace = {}
  exec(compile(cell.source, "install cell", "exec"), namespace)  # noqa: S102
  assert namespace["IN_COLAB"] is False
  return namespace[name]


def test_notebook_install_plan_never_downgrades():
  """Missing requirements are installed as written, older ones upgraded to their floor, newer
  ones (Colab's own jax, TensorFlow) kept and said; an extra's or another platform's skipped."""
  plan = _notebook_function("plan_installs")
  requirements = ["jax>=0.10.0,<0.11", "tensorflow-cpu>=2.20,<2.22; sys_platform == 'linux'",
                  "clu>=0.0.12,<0.1", "numpy>=2.0,<2.5", "optax>=0.2.6,<0.3",
                  "Pillow>=10,<14", "jax[tpu]>=0.10.0,<0.11; extra == 'tpu'",
                  "array-record>=0.8.3,<0.9; sys_platform == 'nonexistent'"]
  installed = {"jax": "0.12.1", "tensorflow-cpu": "2.19.0", "numpy": "2.1.3",
               "optax": "0.2.6", "pillow": "11.3.0"}
  to_install, notes = plan(requirements, installed)
  assert to_install == ["tensorflow-cpu>=2.20", "clu<0.1,>=0.0.12"]
  assert notes == ["jax 0.12.1 kept (newer than the tested <0.11,>=0.10.0)"]
  assert plan(requirements[3:6], installed) == ([], [])
