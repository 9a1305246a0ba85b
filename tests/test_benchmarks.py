"""The benchmark scripts run (tiny shapes, one or two rounds) and print the tables the docs
quote; their paired-ratio statistics match numpy. Their numbers are not asserted: speed is
measured by running them (docs/benchmarks.md), not in tests."""
import collections
import functools
import json
import os
import statistics
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from conftest import FAST_COMPILE, ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import common  # noqa: E402  (benchmarks/common.py, imported as the scripts import it)
import gpu_train  # noqa: E402  (benchmarks/gpu_train.py)
import pallas_attention  # noqa: E402  (benchmarks/pallas_attention.py)


def test_paired_ratios_compare_calls_of_the_same_round():
  baseline, other = [2.0, 2.0, 4.0, 2.0, 3.0], [1.0, 2.0, 8.0, 1.0, 2.0]
  ratios = np.array(baseline) / np.array(other)  # 2, 1, 0.5, 2, 1.5
  stats = common.paired_ratios(baseline, other)
  assert stats["median"] == 1.5
  assert (stats["q1"], stats["q3"]) == tuple(np.quantile(ratios, [0.25, 0.75]))
  assert stats["faster"] == 0.6  # 3 of 5 rounds strictly faster


def _run(script, *args, env=None):
  """stdout of `python benchmarks/{script} {args}`, on CPU; `env` adds to the environment."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": FAST_COMPILE, **(env or {})}
  result = subprocess.run([sys.executable, f"benchmarks/{script}", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


def _rows(stdout, first_cell):
  return [line for line in stdout.splitlines() if line.startswith(f"| {first_cell}")]


@pytest.mark.slow
def test_attention_op_benchmark_times_and_sizes_every_implementation():
  out = _run("attention_op.py", "--lengths", "24", "--heads", "2", "--block_size", "8",
             "--rounds", "1")
  rows = _rows(out, "24 ")
  assert len(rows) == 4 and all(row.rstrip(" |").endswith("ran") for row in rows)
  assert "peak memory at L=24" in out and "worst" in out


@pytest.mark.slow
def test_train_step_benchmark_reports_throughput_mfu_and_gate_cost():
  out = _run("train_step.py", "--config", "configs/repro/mnist_vit.py", "--image_size", "28",
             "--channels", "1", "--models", "size=Ti,patch=4", "--gated", "--batch", "4",
             "--rounds", "2", "--matmul_sizes", "256,512",
             "--xla_options", "xla_cpu_experimental_ynn_fusion_type=")
  rows = {row.split("|")[2].strip(): row for row in _rows(out, "size=Ti,patch=4")}
  # (--control, softmax compiled again, is left out: two more compilations in a tight suite.)
  assert set(rows) == {f"{name}{xla}" for name in ("softmax", "relu", "relu gated")
                       for xla in ("", " +xla")}
  vs_default_xla = [cell.strip() for cell in rows["relu +xla"].split("|")[7:9]]
  assert vs_default_xla[0].endswith("%") and vs_default_xla[1] == ""  # a ratio; not gated
  assert rows["relu gated +xla"].split("|")[8].strip().endswith("x")  # vs relu +xla
  targets = out.split("Targets")[1]
  assert "2 rounds." in out and "relu throughput" in targets
  assert "relu +xla throughput" in targets and "512 +xla:" in out


@pytest.mark.slow
def test_collectives_benchmark_finds_the_ring_permutes_only():
  out = _run("collectives.py", "--devices", "4", "--length", "64", "--heads", "2",
             "--block_size", "16")
  (ring,) = _rows(out, "relu/L seq_parallel")
  (baseline,) = _rows(out, "softmax all-gather")
  assert "collective-permute" in ring and "all-gather" not in ring
  assert "all-gather" in baseline


@pytest.mark.slow
def test_study_throughput_benchmark_charges_each_run_its_evaluators(offline_data_dir,
                                                                    monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", offline_data_dir)
  out = _run("study_throughput.py", "--configs",
             "configs/repro/mnist_vit.py:size=Ti,patch=4,runlocal;"
             "LD_PRELOAD=libtcmalloc_minimal.so.4 configs/local/mnist_relu.py:runlocal",
             "--steps", "1", "--rounds", "1")
  rows = [line for line in out.splitlines()
          if line.startswith("| ") and "configs/" in line.split("|")[1]]
  assert len(rows) == 2
  cells = [[c.strip() for c in row.split("|")[1:-1]] for row in rows]
  # Each config was timed in a process of its own, started with its own environment.
  assert cells[1][0].startswith("LD_PRELOAD=libtcmalloc_minimal.so.4 configs/local/")
  # The cadence of each config: runlocal runs 4 and 6 steps; every evaluator runs at the first
  # and last step, and mnist_relu's at their log_percent too: test every 2 steps (1, 2, 4, 6),
  # attention every step, fewshot every 3 (1, 3, 6).
  assert cells[0][2:4] == ["4", "fewshot x2, test x2"]
  assert cells[1][2:4] == ["6", "attention x6, fewshot x3, test x4"]
  assert cells[0][8] == "1.00x [1.00, 1.00]" and cells[1][8].endswith("]")
  assert all(float(c[4]) > 0 and float(c[5]) > 0 for c in cells)
  # The input alone costs a part of a step (which draws its batch too), never nothing.
  assert all(0 < float(c[6].rstrip("%")) < 100 for c in cells)
  # Start-up (compilation, the first batch), charged once per run, lowers what a run pays.
  assert all(float(c[9]) > 0 and 0 < float(c[10]) < float(c[5]) for c in cells)
  assert cells[0][11] == "1.00x [1.00, 1.00]" and cells[1][11].endswith("]")


@pytest.mark.slow
def test_gpu_train_runs_a_phase_here_and_tabulates_it(tmp_path):
  """benchmarks/gpu_train.py's device command, one phase for 4 steps on slices of the data: a
  real trainer on the memory path, its records in runs.json, its img/sec/core beside the
  archived CPU runs of the same model, and `summary` redraws the table from runs.json."""
  # Its deadline (45 s on the GPU) x 10: a trainer's start takes longer on this CPU.
  out = _run("gpu_train.py", "run", "--phases", "L196", "--config_suffix", ",runlocal=True",
             "--time_scale", "10", "--out", str(tmp_path))
  runs = json.loads((tmp_path / "runs.json").read_text())
  (process,) = runs["phases"]["L196"]["processes"]
  assert process["returncode"] == 0, process["log_tail"]
  assert runs["phases"]["L196"]["config"].endswith("patch=2,validation=5000,eval_points=20,"
                                                   "epochs=40,input=memory,runlocal=True")
  assert max(r["step"] for r in process["records"]) == 4
  rate = statistics.median(r["img/sec/core"] for r in process["records"] if "img/sec/core" in r)
  (row,) = [line for line in out.splitlines() if line.startswith("| L196 |")]
  cells = [c.strip() for c in row.split("|")[1:-1]]
  assert cells[:5] == ["L196", "1", "4", f"{rate:,.0f}", f"{rate:,.0f}"]
  # The baseline: the fastest CPU's median, over both studies' archived runs of the model.
  cpu_rates = collections.defaultdict(list)
  for pattern in ("fmnist/runs/fmnist_vit-Ti-p2-relu-a1-qk_norm-nogated-e*",
                  "alpha_length/runs/fmnist_vit-Ti-p2-relu-a1-qk_norm-nogated-e40-*"):
    for run in (ROOT / "results").glob(pattern):
      cpu = json.loads((run / "provenance.json").read_text())["machine"]["cpu"]
      cpu_rates[cpu].append(statistics.median(
          json.loads(line)["img/sec/core"] for line in open(run / "metrics.jsonl")
          if '"img/sec/core"' in line))
  fastest = max(statistics.median(rates) for rates in cpu_rates.values())
  assert sum(map(len, cpu_rates.values())) >= 3 and cells[5].startswith(f"{fastest:,.0f} (")
  assert cells[6] == f"{rate / fastest:.1f}x"
  assert (tmp_path / "summary.md").read_text() in out
  assert _run("gpu_train.py", "summary", str(tmp_path)) == (tmp_path / "summary.md").read_text()


def test_gpu_train_judges_the_cell_by_the_welch_rule():
  """The cell's rule (docs/benchmarks.md 9): the Welch 90% interval of mean(GPU) - mean(CPU),
  against an independent Welch-Satterthwaite computation."""
  from scipy import stats

  def welch(a, b):
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = stats.t.ppf(0.95, df) * np.sqrt(va + vb)
    d = np.mean(a) - np.mean(b)
    return d, d - half, d + half

  cpu = [0.8995, 0.8980, 0.9004]
  for gpu, verdict, inside in (([0.8990, 0.9001, 0.8985], "agree", "inside"),
                               ([0.9150, 0.9162, 0.9171], "differ", "outside")):
    d, low, high = welch(gpu, cpu)
    assert gpu_train.cell_comparison(gpu, cpu) == (
        f"GPU - CPU: {100 * d:+.2f} points, Welch 90% [{100 * low:+.2f}, {100 * high:+.2f}]: "
        f"**{verdict}** (margin 0.6 points); the GPU mean is {inside} the CPU seeds' range")
  # A wide interval that includes 0: not shown.
  assert "**not shown**" in gpu_train.cell_comparison([0.890, 0.905, 0.899], cpu)
  assert gpu_train.cell_comparison([0.899], cpu).startswith("Not judged: 1 finished GPU seeds")


def test_no_thp_turns_transparent_huge_pages_off_for_the_process_and_its_children():
  """benchmarks/no_thp on PYTHONPATH (section 3's timing without huge pages) sets the flag that
  the kernel reports as THP_enabled in /proc/PID/status; a child started by it keeps it."""
  show = ("import subprocess, sys; print(open('/proc/self/status').read().split("
          "'THP_enabled:')[1].split()[0]); sys.stdout.flush(); subprocess.run(['grep', "
          "'THP_enabled', '/proc/self/status'], check=True)")
  env = {**os.environ, "PYTHONPATH": str(ROOT / "benchmarks" / "no_thp")}
  off = subprocess.run([sys.executable, "-c", show], env=env, capture_output=True, text=True,
                       check=True).stdout.split()
  on = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True,
                      check=True).stdout.split()
  # Without it a process inherits the suite's own flag: 1, unless a parent turned it off.
  ours = open("/proc/self/status").read().split("THP_enabled:")[1].split()[0]
  assert on == [ours, "THP_enabled:", ours]
  assert off == ["0", "THP_enabled:", "0"]


# A sitecustomize.py that makes the packages the GPU machine lacks unimportable.
_NO_TENSORFLOW = textwrap.dedent("""\
    import importlib.abc
    import sys

    class _Absent(importlib.abc.MetaPathFinder):
      def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("tensorflow", "tensorflow_datasets", "clu",
                                      "ml_collections"):
          raise ImportError(f"{name} is absent, as on the GPU machine")

    sys.meta_path.insert(0, _Absent())
""")


@pytest.mark.slow
def test_pallas_attention_benchmark_dry_run_without_tensorflow(tmp_path):
  """--dry runs every table on CPU (the Pallas interpreter) with TensorFlow, TFDS, clu and
  ml_collections unimportable, as on the GPU machine the full run is for."""
  (tmp_path / "sitecustomize.py").write_text(_NO_TENSORFLOW)
  env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path),
                                                     os.environ.get("PYTHONPATH")]))}
  blocked = subprocess.run([sys.executable, "-c", "import ml_collections"], env={
      **os.environ, **env}, capture_output=True, text=True, check=False)
  assert "absent, as on the GPU machine" in blocked.stderr  # the blocker is in force
  out = _run("pallas_attention.py", "--dry", "--tables", "op,errors,memory,train", env=env)
  ops, rest = out.split("bf16 error vs float32")
  errors, memory = rest.split("Compiled memory")
  impls = ["pallas relu/L", "dense relu/L", "chunked relu/L", "softmax xla"]
  for table, column in ((ops, 3), (memory, 2)):  # the implementation's column
    rows = _rows(table, "39 ")
    assert [row.split("|")[column].strip() for row in rows] == impls
    assert all(row.rstrip(" |").endswith("ran") for row in rows)
  assert [row.split("|")[3].strip() for row in _rows(errors, "relu ")] == ["output", "dq", "dk",
                                                                           "dv"]
  assert "fwd speed vs softmax xla" in ops  # the forward alone, timed in the same rounds
  assert len(_rows(errors, "gelu ")) == 4
  assert "rule met in" in errors
  steps = _rows(memory, "mu/8 ")
  assert len(steps) == 4 and all(row.rstrip(" |").endswith("ran") for row in steps)


def test_archived_throughput_is_images_over_the_last_core_hours(tmp_path):
  """Each run pays its last step x batch images over its last logged core hours (a line
  without core hours keeps the earlier value); a glob without runs is an error."""
  for name, batch, lines in (
      ("a-seed0", 32, [{"step": 1, "core_hours": 0.001}, {"step": 1250, "core_hours": 0.25}]),
      ("a-seed1", 32, [{"step": 1000, "core_hours": 0.2}, {"step": 1250}]),
      ("a-seed2", 128, [{"step": 900, "core_hours": 0.5}])):
    run = tmp_path / name
    run.mkdir()
    (run / "config.json").write_text(f'{{"input": {{"batch_size": {batch}}}}}')
    (run / "metrics.jsonl").write_text("".join(f"{x}\n".replace("'", '"') for x in lines))
  rates = sorted([1250 * 32 / (0.25 * 3600), 1250 * 32 / (0.2 * 3600), 900 * 128 / 1800])
  out = _run("archived_throughput.py", str(tmp_path / "a-*"))
  assert out.strip() == (f"{tmp_path / 'a-*'}: 3 runs, img/s/core median {rates[1]:.1f} "
                         f"[min {rates[0]:.1f}, max {rates[2]:.1f}]")
  missing = subprocess.run([sys.executable, "benchmarks/archived_throughput.py",
                            str(tmp_path / "b-*")], cwd=ROOT, capture_output=True, text=True)
  assert missing.returncode != 0 and "no run directory matches" in missing.stderr


def test_splash_baseline_equals_softmax_attention():
  """The TPU softmax baseline of benchmarks/pallas_attention.py, jax's splash attention (in its
  interpreter here) on 39 tokens padded to 128 in a segment of their own, gives softmax
  attention's output and q/k/v gradients."""
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  q, k, v, d_out = (jax.random.normal(key, (2, 39, 2, 64)) for key in keys)

  def output_and_grads(fn):
    out, vjp = jax.vjp(fn, q, k, v)
    return out, vjp(d_out)

  splash, want = jax.jit(lambda: [output_and_grads(fn) for fn in (
      functools.partial(pallas_attention.splash_softmax, interpret=True),
      functools.partial(jax.nn.dot_product_attention, implementation="xla"))])()
  for got, expected in zip(jax.tree.leaves(splash), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=2e-5)


def test_gpu_check_script_is_shellcheck_clean():
  """benchmarks/gpu_check.sh, the GPU session's one command, cannot be run here: it is linted."""
  shellcheck = os.path.join(os.path.dirname(sys.executable), "shellcheck")
  result = subprocess.run([str(shellcheck), str(ROOT / "benchmarks" / "gpu_check.sh")],
                          capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
