r"""Preempts a 2-process training job on loopback many times; reports how every process ended.

    python tools/preemption_stress.py [--trials 20] [--signalled all|0|1|cycle] [--out DIR]

Each trial starts two real trainer processes (`python -m big_vision_relu.train`, 2 simulated CPU
devices each, joined with `--coordinator_address 127.0.0.1:PORT`) on the main job's config
(`configs/local/mnist_relu.py:runlocal=True`, made endless: `--config.total_steps=100000`), waits
until a few steps are logged plus a random 0-1 s, and sends SIGTERM to the processes named by
`--signalled` (`all`: both, in random order; `0` or `1`: that one alone, as a maintenance event
on one host; `cycle`: all, 1, 0, all, ...). A trial passes when

- every process exits with `preemption.PREEMPTED_EXIT_CODE` ("saved, not finished") within
  `--timeout` seconds;
- both logs name the same preemption step and that step is the only checkpoint on disk;
- no log holds an abort or crash dump ("Fatal Python error", "Aborted", "Check failed", "core
  dumped", a C++ fatal log line, or a Python traceback).

It prints one line per trial and a summary, keeps each trial's logs in `--out`, and exits 1 if any
trial failed. docs/benchmarks.md ("Preemption of a 2-process job") records a run of it.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from big_vision_relu import preemption  # noqa: E402  (after the path)

CONFIG = "configs/local/mnist_relu.py:runlocal=True"
OVERRIDES = ("--config.total_steps=100000", "--config.ckpt_steps=100000",
             "--config.log_training_steps=1")
# What an abort, a C++ fatal error or an uncaught exception leaves in a log.
CRASH = re.compile(r"Fatal Python error|Aborted|Check failed|core dumped|^F\d{4} |"
                   r"^Traceback \(most recent call last\)|terminate called", re.MULTILINE)
STOPPED_AT = re.compile(r"Preemption notice \(SIGTERM[^)]*\) at step (\d+)")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def spawn(workdir: pathlib.Path, data_dir: str, port: int, index: int,
          log: pathlib.Path) -> subprocess.Popen:
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
         "JAX_PLATFORMS": "cpu", "TFDS_DATA_DIR": data_dir, "TF_CPP_MIN_LOG_LEVEL": "3"}
  command = [sys.executable, "-m", "big_vision_relu.train", "--config", CONFIG,
             "--workdir", str(workdir), *OVERRIDES, "--coordinator_address",
             f"127.0.0.1:{port}", "--num_processes", "2", "--process_id", str(index)]
  with log.open("w") as out:
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def logged_steps(workdir: pathlib.Path) -> int:
  path = workdir / "metrics.jsonl"
  return len(path.read_text().splitlines()) if path.exists() else 0


def trial(index: int, signalled: str, out: pathlib.Path, data_dir: str, *, min_steps: int,
          timeout: float, rng: random.Random) -> dict:
  """One trial; returns what happened (and `ok`)."""
  trial_dir = out / f"trial{index:02d}"
  workdir = trial_dir / "run"
  logs = [trial_dir / f"process{i}.log" for i in range(2)]
  trial_dir.mkdir(parents=True)
  port = free_port()
  procs = [spawn(workdir, data_dir, port, i, logs[i]) for i in range(2)]
  result = {"trial": index, "signalled": signalled, "problems": []}
  try:
    deadline = time.monotonic() + 600
    while logged_steps(workdir) < min_steps:
      if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
        result["problems"].append("a process ended (or 600 s passed) before the signal")
        break
      time.sleep(0.05)
    else:
      time.sleep(rng.uniform(0, 1))
      targets = [0, 1] if signalled == "all" else [int(signalled)]
      rng.shuffle(targets)
      sent = time.monotonic()
      for target in targets:
        procs[target].send_signal(signal.SIGTERM)
      for proc in procs:
        try:
          proc.wait(timeout=max(1.0, sent + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
          result["problems"].append(f"pid {proc.pid} still running {timeout:.0f} s later")
      result["seconds"] = round(time.monotonic() - sent, 1)
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  result["exit"] = [p.returncode for p in procs]
  if result["exit"] != [preemption.PREEMPTED_EXIT_CODE] * 2:
    result["problems"].append(f"exit statuses {result['exit']}, expected "
                              f"{preemption.PREEMPTED_EXIT_CODE} for both")
  texts = [log.read_text(errors="replace") for log in logs]
  for i, text in enumerate(texts):
    crash = CRASH.search(text)
    if crash:
      line = text[text.rfind("\n", 0, crash.start()) + 1:].split("\n", 1)[0]
      result["problems"].append(f"process {i}: {line.strip()[:160]}")
  stopped = [STOPPED_AT.findall(text) for text in texts]
  directory = workdir / "checkpoints"
  steps = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if (
      directory.exists()) else []
  result["stopped_at"], result["checkpoints"] = stopped, steps
  if not (len(stopped[0]) == 1 and stopped[0] == stopped[1] and steps == [int(stopped[0][0])]):
    result["problems"].append(f"preemption steps {stopped}, checkpoints {steps}")
  result["ok"] = not result["problems"]
  return result


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--trials", type=int, default=20)
  parser.add_argument("--signalled", default="all", choices=["all", "0", "1", "cycle"])
  parser.add_argument("--min_steps", type=int, default=5,
                      help="metrics.jsonl lines (logged steps) before the signal")
  parser.add_argument("--timeout", type=float, default=120.0,
                      help="seconds every process has to exit after the signal")
  parser.add_argument("--seed", type=int, default=0, help="of the delays and signal orders")
  parser.add_argument("--out", default=None, help="trial logs (default: a new temporary dir)")
  args = parser.parse_args()
  out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="preemption_stress-"))
  out.mkdir(parents=True, exist_ok=True)
  data_dir = str(out / "tensorflow_datasets")
  subprocess.run([sys.executable, "-m", "big_vision_relu.data.prepare", "--data_dir", data_dir],
                 cwd=ROOT, check=True, capture_output=True)
  rng = random.Random(args.seed)
  cycle = ["all", "1", "0"]
  results = []
  for i in range(args.trials):
    signalled = cycle[i % 3] if args.signalled == "cycle" else args.signalled
    result = trial(i, signalled, out, data_dir, min_steps=args.min_steps, timeout=args.timeout,
                   rng=rng)
    results.append(result)
    print(f"trial {i:2d} SIGTERM to {signalled:>3}: {'ok  ' if result['ok'] else 'FAIL'} "
          f"exit {result['exit']} after {result.get('seconds', '-')} s, stopped at "
          f"{result['stopped_at']}, checkpoints {result['checkpoints']}"
          + "".join(f"\n    {p}" for p in result["problems"]), flush=True)
  (out / "results.json").write_text(json.dumps(results, indent=1))
  passed = sum(r["ok"] for r in results)
  print(f"{passed} of {len(results)} trials passed (logs: {out})")
  sys.exit(0 if passed == len(results) else 1)


if __name__ == "__main__":
  main()
