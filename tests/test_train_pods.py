"""The trainer on a pod of two real processes on loopback: 2 processes == 1 process, preemption
(SIGTERM to all or one), a lost peer (kill -9 of a worker or of the coordinator) and a re-run
that ends bit-identical to an uninterrupted run.

One uninterrupted 2-process run (a module fixture) is the reference of two tests: each trainer
process costs ~15 s of CPU to start, most of this suite's time."""
import re
import shutil
import signal
import subprocess
import time

import jax
import pytest

from big_vision_relu import multihost, preemption
from trainer_processes import (TRAIN_METRICS, assert_continues_from, assert_trees_close,
                               assert_trees_equal, final_params, logged_records, spawn_pair,
                               spawn_trainer, tiny_config, workdir_files, write_config)


@pytest.fixture(scope="module")
def uninterrupted_pair(offline_data_dir, tmp_path_factory):
  """(config path, config, workdir, outputs) of an uninterrupted 2-process run: 20 steps, a
  checkpoint every 5, evaluated (at the first and last step) on 100 test images, so that both
  hosts see padding."""
  root = tmp_path_factory.mktemp("uninterrupted_pair")
  config = tiny_config(offline_data_dir, total_steps=20, ckpt_steps=5, log_training_steps=5)
  config.evals.test = dict(type="classification", data=dict(
      name="mnist5k", split="test[:100]", data_dir=offline_data_dir),
      pp_fn=config.input.pp, batch_size=24)
  path = write_config(root, config)
  procs = spawn_pair(path, root / "run")
  outs = [p.communicate(timeout=400)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  return path, config, root / "run", outs


@pytest.mark.slow
def test_two_processes_equal_one_process(uninterrupted_pair, tmp_path):
  """2 processes x 2 devices (jax.distributed + gloo on loopback) == 1 process x 4 devices."""
  path, config, multi, outs = uninterrupted_pair
  single = tmp_path / "single"
  proc = spawn_trainer(path, single, devices=4, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
  out = proc.communicate(timeout=300)[0]
  assert proc.returncode == 0, out[-3000:]
  _, single_params = final_params(single)
  _, multi_params = final_params(multi)
  assert_trees_close(multi_params, single_params, atol=1e-5)
  single_m, multi_m = logged_records(single), logged_records(multi)
  assert single_m[-1]["test/num_examples"] == multi_m[-1]["test/num_examples"] == 100
  assert multi_m[-1]["test/prec@1"] == pytest.approx(single_m[-1]["test/prec@1"], abs=1e-6)
  # Only process 0 printed the final metrics.
  assert sum('"training_loss"' in out for out in outs) == 1

  # Another config into that workdir (a copy): every process stops alike, and nothing is written.
  workdir = shutil.copytree(multi, tmp_path / "multi")
  before = workdir_files(workdir)
  changed = config.copy_and_resolve_references()
  changed.lr = 1e-2
  procs = spawn_pair(write_config(tmp_path, changed, "changed.py"), workdir)
  for p in procs:
    out = p.communicate(timeout=400)[0]
    assert p.returncode != 0 and "ConfigChangedError" in out, out[-3000:]
    assert "holds a run with another config: 1 key(s) differ" in out and "lr: 0.003 -> 0.01" in out
  assert workdir_files(workdir) == before


def _wait_for_steps(workdir, procs, n, timeout=240):
  jsonl = workdir / "metrics.jsonl"
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline and all(p.poll() is None for p in procs) and (
      not jsonl.exists() or len(jsonl.read_text().splitlines()) < n):
    time.sleep(0.05)
  assert all(p.poll() is None for p in procs), "a trainer ended before the signal"


@pytest.mark.slow
@pytest.mark.parametrize("signalled", ["all", "one"])
def test_two_processes_sigterm_save_the_same_step_and_exit_preempted(offline_data_dir, tmp_path,
                                                                     signalled):
  """SIGTERM to every worker (a preempted pod) or to one (a maintenance event on one host):
  both processes agree on a step, save it, and exit with PREEMPTED_EXIT_CODE ("saved, not
  finished") within 60 s, with no abort or crash dump (tools/preemption_stress.py repeats
  this 20 times: docs/benchmarks.md)."""
  config = tiny_config(offline_data_dir, total_steps=100_000, ckpt_steps=1000,
                       log_training_steps=1)
  path = write_config(tmp_path, config)
  workdir = tmp_path / "run"
  logs = [tmp_path / f"process{i}.log" for i in range(2)]
  procs = spawn_pair(path, workdir, logs=logs)
  _wait_for_steps(workdir, procs, 5)
  sent = time.monotonic()
  for proc in (procs if signalled == "all" else procs[1:]):
    proc.send_signal(signal.SIGTERM)
  for proc in procs:
    proc.wait(timeout=60)
  elapsed = time.monotonic() - sent
  print(f"SIGTERM to {signalled}: both exited {elapsed:.1f} s later")
  assert [p.returncode for p in procs] == [preemption.PREEMPTED_EXIT_CODE] * 2, [
      log.read_text()[-3000:] for log in logs]
  assert elapsed < 60
  step, _ = final_params(workdir)
  assert 5 <= step < 1000  # saved where they stopped, although no checkpoint was due
  steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert steps == [step]
  for log in logs:
    assert not re.search(r"Fatal Python error|Aborted|Check failed|^F\d{4} ", log.read_text(),
                         re.MULTILINE), log.read_text()[-3000:]
  stopped = [re.findall(r"Preemption notice \(SIGTERM to this or another process\) at step "
                        r"(\d+)", log.read_text()) for log in logs]
  assert stopped == [[str(step)], [str(step)]], stopped


def _kill9_and_wait_for_the_other(procs, victim: int) -> None:
  """kill -9 of `procs[victim]`, then waits (at most 3 minutes) for the other to exit."""
  other = 1 - victim
  killed = time.monotonic()
  procs[victim].send_signal(signal.SIGKILL)
  procs[victim].wait()
  procs[other].wait(timeout=180)
  print(f"kill -9 of process {victim}: process {other} exited "
        f"{time.monotonic() - killed:.1f} s later")


@pytest.mark.slow
def test_two_processes_kill9_of_one_stops_the_other_with_a_message(offline_data_dir, tmp_path):
  """kill -9 of a worker: the other exits non-zero within 3 minutes, saying a peer was lost
  and which checkpoint a re-run resumes from; that checkpoint is intact."""
  config = tiny_config(offline_data_dir, total_steps=100_000, ckpt_steps=5,
                       log_training_steps=1)
  path = write_config(tmp_path, config)
  workdir = tmp_path / "run"
  logs = [tmp_path / f"process{i}.log" for i in range(2)]
  # A shorter watchdog than the default 60 s keeps the test short; the mechanism is the same.
  procs = spawn_pair(path, workdir, logs=logs, extra=("--peer_timeout_s", "10"))
  _wait_for_steps(workdir, procs, 12)
  _kill9_and_wait_for_the_other(procs, victim=1)
  assert procs[0].returncode == multihost.PEER_LOST_EXIT_CODE
  step, params = final_params(workdir)  # restores: intact
  assert step >= 5 and jax.tree.leaves(params)
  lines = [l for l in logs[0].read_text().splitlines() if l.startswith("error: Lost a peer")]
  assert len(lines) == 1, logs[0].read_text()[-3000:]
  assert "process 1 sent no heartbeat" in lines[0]
  assert f"resumes from checkpoint {step} in {workdir / 'checkpoints'}" in lines[0]


@pytest.mark.slow
def test_two_processes_kill9_of_the_coordinator_stops_the_other_then_resume(uninterrupted_pair,
                                                                           tmp_path):
  """kill -9 of process 0, which hosts JAX's coordination service (its runtime client in every
  other process aborts at once): the other exits 75 within 3 minutes with one line naming
  process 0 and the checkpoint on disk; that checkpoint is intact. The pod has then lost every
  worker, none of them by a clean exit: a re-run resumes from that checkpoint and ends
  bit-identical to an uninterrupted 2-process run."""
  path, _, uninterrupted, _ = uninterrupted_pair
  workdir, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
  logs = [tmp_path / f"process{i}.log" for i in range(2)]
  procs = spawn_pair(path, workdir, logs=logs)
  deadline = time.monotonic() + 300
  while not (checkpoints / "5").exists() and time.monotonic() < deadline and all(
      p.poll() is None for p in procs):
    time.sleep(0.05)
  assert all(p.poll() is None for p in procs), logs[0].read_text()[-3000:]
  _kill9_and_wait_for_the_other(procs, victim=0)
  log = logs[1].read_text()
  assert procs[1].returncode == multihost.PEER_LOST_EXIT_CODE, log[-3000:]
  step = multihost.latest_finalized_step(checkpoints)
  assert 5 <= step < 20
  assert final_params(workdir)[0] == step  # restores: intact
  lines = [l for l in log.splitlines() if l.startswith("error: Lost a peer")]
  assert len(lines) == 1, log[-3000:]
  assert "process 0" in lines[0], lines[0]
  assert f"resumes from checkpoint {step} in {checkpoints}." in lines[0], lines[0]
  killed = logged_records(workdir)

  logs = [tmp_path / f"resumed{i}.log" for i in range(2)]
  for proc in spawn_pair(path, workdir, logs=logs):
    assert proc.wait(timeout=400) == 0, logs[0].read_text()[-3000:]
  assert f"Resumed from step {step} " in logs[0].read_text()
  # The log continues from the checkpoint (the first step of a start is logged too), each step
  # once, with the uninterrupted run's metrics step for step ...
  resumed = assert_continues_from(logged_records(workdir), step, first=len(killed))
  assert [r["step"] for r in resumed] == [step + 1, *range(step + 5, 21, 5)]
  expected = {r["step"]: r for r in logged_records(uninterrupted)}
  for record in resumed[1:]:
    assert {k: record[k] for k in TRAIN_METRICS} == {
        k: expected[record["step"]][k] for k in TRAIN_METRICS}, record["step"]
  assert resumed[-1]["test/prec@1"] == expected[20]["test/prec@1"]
  # ... and it ends with the same bits.
  final_step, params = final_params(workdir)
  assert final_step == 20
  assert_trees_equal(params, final_params(uninterrupted)[1])
