r"""End-to-end training throughput per core of study runs, as a run pays it: input, step, evals.

    taskset -c 0 python benchmarks/study_throughput.py [--configs 'CONFIG;CONFIG...']

For each config (`;`-separated `[NAME=VALUE ...] file.py:args`: environment variables, then the
config; by default the MNIST-5k study's S/patch-2 runs and the Fashion-MNIST study's, each as
its study's trainers run: the latter with `study.TRAINER_MALLOC` preloaded), the trainer's own
pieces (`run.setup`: the jitted update step with the config's XLA options; its tf.data input
pipeline; its evaluators) run in a worker process of its own, started with those variables (as
a study starts its trainers: LD_PRELOAD and GLIBC_TUNABLES act only at a process's start), the
configs taking turns round by round so that the machine's load hits them alike. A round times
`--steps` training steps (next host batch, global batch, update) and one call of every
evaluator, in CPU seconds of the worker (`time.process_time`: core-seconds, as the trainer
counts core hours on CPU), and then as many host batches drawn from the input pipeline alone,
whose share of the training steps' CPU time is the input's. The run's cost is then

    core-seconds per run = total_steps x (step) + sum over evaluators of (calls per run) x (call)

with the calls per run from the config's own cadence (first and last step, log_* ...), and the
throughput that a run pays is its training images / that cost. Start-up is left out of it,
and shown beside it: the CPU seconds of the worker's first step and first call of every
evaluator (compilation, and the input pipeline's first batch: what a trainer's first step and
evaluations pay, inside its core hours) less a round's step and evaluations, charged once per
run (cold: the worker compiles without the persistent compilation cache a study's trainers
keep, unless JAX_COMPILATION_CACHE_DIR is given among its variables). Ratios are to the first
config; medians over rounds are shown.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import jax
import numpy as np

from big_vision_relu import run as run_lib
from big_vision_relu.data import input_pipeline
from big_vision_relu.experiments import study, sweep

import common


class Subject:
  """One config's trainer pieces, ready to time."""

  def __init__(self, config_arg: str):
    self.config = config = sweep.load_config_file(config_arg)
    self.run = run = run_lib.setup(config)
    self.batch_size = config.input.batch_size
    self.total_steps = run.steps["total"]
    with jax.set_mesh(run.mesh):
      self.state = jax.jit(run.init_state, out_shardings=run.state_shardings)(
          jax.random.PRNGKey(0))
      self.evaluators = run_lib.make_evaluators(run)
    self.calls = {e.name: sum(e.due(s) for s in range(1, self.total_steps + 1))
                  for e in self.evaluators}
    self.batches = input_pipeline.training_batches(
        config.input.data, config.input.pp, self.batch_size, seed=0, start_step=0,
        process_index=0, process_count=1)

  def train_steps(self, steps: int) -> float:
    """CPU seconds per step over `steps` steps (input + update)."""
    start = time.process_time()
    with jax.set_mesh(self.run.mesh):
      for _ in range(steps):
        host = next(self.batches)
        batch = input_pipeline.make_global_batch(
            {k: host[k] for k in ("image", "labels")}, self.run.mesh, run_lib.DATA_AXIS)
        self.state, metrics = self.run.update(self.state, batch)
      jax.block_until_ready(metrics)
    return (time.process_time() - start) / steps

  def input_only(self, steps: int) -> float:
    """CPU seconds per host batch of the input pipeline alone (tf.data's threads included)."""
    start = time.process_time()
    for _ in range(steps):
      next(self.batches)
    return (time.process_time() - start) / steps

  def evaluate(self) -> dict[str, float]:
    """CPU seconds of one call of each evaluator."""
    seconds = {}
    with jax.set_mesh(self.run.mesh):
      for evaluator in self.evaluators:
        start = time.process_time()
        evaluator.run(self.state["params"])
        seconds[evaluator.name] = time.process_time() - start
    return seconds

  def close(self) -> None:
    self.batches.close()


_RESULT = "RESULT"  # marks a worker's result lines on its stdout


def worker(config_arg: str, steps: int) -> None:
  """Sets up `config_arg`, compiles, prints its shape, then one JSON line per round asked for on
  stdin: CPU seconds per step, per evaluator call and per host batch of input alone."""
  subject = Subject(config_arg)
  start = time.process_time()
  subject.train_steps(1)  # compiles the step and every evaluator, as a trainer's first ones do
  subject.evaluate()
  print(_RESULT, json.dumps({"batch_size": subject.batch_size,
                             "total_steps": subject.total_steps, "calls": subject.calls,
                             "first_s": time.process_time() - start}), flush=True)
  for _ in sys.stdin:
    print(_RESULT, json.dumps({"step_s": subject.train_steps(steps),
                               "eval_s": subject.evaluate(),
                               "input_s": subject.input_only(steps)}), flush=True)
  subject.close()


class Worker:
  """A config timed in its own process: `[NAME=VALUE ...] file.py:args`."""

  def __init__(self, spec: str, steps: int):
    *assignments, config_arg = spec.split()
    env = dict(os.environ)
    for assignment in assignments:
      name, sep, value = assignment.partition("=")
      if not sep:
        raise ValueError(f"{spec!r}: {assignment!r} is not NAME=VALUE")
      env[name] = value
    self.name = spec
    self.process = subprocess.Popen(
        [sys.executable, __file__, "--worker", config_arg, "--steps", str(steps)], env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

  def wait_ready(self) -> None:
    """Waits for the worker's set-up and compilation (the workers compile in parallel)."""
    shape = self._read()
    self.batch_size, self.total_steps, self.calls, self.first_s = (
        shape["batch_size"], shape["total_steps"], shape["calls"], shape["first_s"])

  def _read(self) -> dict:
    """The worker's next result line (other output of its libraries passes through)."""
    for line in self.process.stdout:
      if line.startswith(_RESULT):
        return json.loads(line[len(_RESULT):])
      sys.stdout.write(line)
    raise RuntimeError(f"the worker of {self.name!r} exited with {self.process.wait()}")

  def round(self) -> dict:
    self.process.stdin.write("round\n")
    self.process.stdin.flush()
    return self._read()

  def run_cost(self, step_s: float, eval_s: dict[str, float]) -> float:
    """Core-seconds of a whole run (without start-up)."""
    return self.total_steps * step_s + sum(self.calls[k] * eval_s[k] for k in self.calls)

  def startup_cost(self, step_s: float, eval_s: dict[str, float]) -> float:
    """Core-seconds that start-up (compilation, the first batch) adds to a run: the first step
    and evaluator calls less a round's."""
    return self.first_s - step_s - sum(eval_s.values())

  def close(self) -> None:
    self.process.stdin.close()
    self.process.wait()


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--configs", default="configs/repro/mnist_vit.py:size=S,patch=2;"
                      f"LD_PRELOAD={study.TRAINER_MALLOC} configs/study/fmnist_vit.py:patch=2",
                      help="';'-separated [NAME=VALUE ...] file.py:args; the default: each "
                      "study's config as its trainers run (the Fashion-MNIST study's with its "
                      "trainers' malloc)")
  parser.add_argument("--steps", type=int, default=10, help="training steps timed per round")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one config's process
  args = parser.parse_args()
  if args.worker:
    worker(args.worker, args.steps)
    return
  print(f"jax {jax.__version__}, {jax.device_count()} device(s), CPU cores "
        f"{sorted(os.sched_getaffinity(0))}", flush=True)
  subjects = [Worker(c, args.steps) for c in args.configs.split(";")]
  for subject in subjects:
    subject.wait_ready()
  times = {s.name: [] for s in subjects}
  for i in range(args.rounds):
    for subject in subjects if i % 2 == 0 else subjects[::-1]:
      times[subject.name].append(subject.round())
  rows = []
  base = subjects[0]
  base_rates = base_started_rates = None
  for subject in subjects:
    steps = [t["step_s"] for t in times[subject.name]]
    evals = [t["eval_s"] for t in times[subject.name]]
    train_rates = np.array([subject.batch_size / t for t in steps])
    images = subject.total_steps * subject.batch_size
    run_rates = np.array([images / subject.run_cost(t, e)
                          for t, e in zip(steps, evals, strict=True)])
    startup_s = np.array([subject.startup_cost(t, e) for t, e in zip(steps, evals, strict=True)])
    started_rates = np.array([images / (subject.run_cost(t, e) + c)
                              for t, e, c in zip(steps, evals, startup_s, strict=True)])
    if subject is base:
      base_rates, base_started_rates = run_rates, started_rates
    eval_share = np.median([1 - subject.total_steps * t / subject.run_cost(t, e)
                            for t, e in zip(steps, evals, strict=True)])
    input_share = np.median([t["input_s"] / t["step_s"] for t in times[subject.name]])
    ratios = common.paired_ratios(1 / run_rates, 1 / base_rates)
    started_ratios = common.paired_ratios(1 / started_rates, 1 / base_started_rates)
    rows.append((subject.name, subject.batch_size, subject.total_steps,
                 ", ".join(f"{k} x{n}" for k, n in subject.calls.items()),
                 f"{np.median(train_rates):.1f}", f"{np.median(run_rates):.1f}",
                 f"{100 * input_share:.1f}%", f"{100 * eval_share:.1f}%",
                 _ratio(ratios), f"{np.median(startup_s):.0f}",
                 f"{np.median(started_rates):.1f}", _ratio(started_ratios)))
    subject.close()
  print(f"\n{args.rounds} rounds of {args.steps} steps + every evaluator once; medians over "
        "rounds; img/s per core = images / CPU seconds of each config's process\n")
  common.print_table(("config", "batch", "steps/run", "evals/run", "train img/s/core",
                      "run img/s/core (input, step, evals)",
                      "input's share of a step", "evals' share",
                      f"run throughput vs {base.name} (per round: median [quartiles])",
                      "start-up: compilation, first batch (core-s, once per run)",
                      "run img/s/core with start-up", "with start-up vs the first"), rows)


def _ratio(ratios: dict[str, float]) -> str:
  """A throughput ratio from `common.paired_ratios` of costs: median [quartiles]."""
  return f"{1 / ratios['median']:.2f}x [{1 / ratios['q3']:.2f}, {1 / ratios['q1']:.2f}]"


if __name__ == "__main__":
  main()
