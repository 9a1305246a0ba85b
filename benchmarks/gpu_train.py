r"""Issue 85's GPU half in one command: the study's model and ViT-S/16 at 224 px trained there
from the in-memory input path, img/s against one CPU core, and a study cell's three seeds
against that cell's CPU seeds.

    python benchmarks/gpu_train.py prepare         # here, once: .gpu/ (data and a wheel)
    python3 benchmarks/gpu_train.py run --out "$OUT"   # there, carrying .gpu (about 8 min)
    python benchmarks/gpu_train.py summary DIR     # here: the tables again from DIR/runs.json

`prepare` copies Fashion-MNIST's IDX files (Debian's dataset-fashion-mnist) into .gpu/ and
downloads ml_collections' wheel there: the GPU machine has neither and no network (docs/gpu.md).
`run` installs the wheel into a private directory, puts the IDX files where the memory path
looks for them, then trains `python -m big_vision_relu.train` processes phase by phase, each
phase under a deadline (SIGTERM then: the trainer saves and exits), workdirs in a temporary
directory:

  cell      the alpha-length study's L = 16 relu alpha 1 cell, its recipe whole (40 epochs,
            validation 5,000, 21 evaluations), seeds 0-2 at once, input=memory
  L49       the study's model at L = 49, one process: img/s
  L196      at L = 196, one process; L196x4: four at once (several runs sharing the GPU)
  S16_224   ViT-S/16 (width 384, depth 12, 6 heads) on Fashion-MNIST resized to 224 x 224

It writes OUT/runs.json (every process's metrics.jsonl records, exit status, wall seconds,
log tail) and OUT/summary.md: img/sec/core (the trainer's own metric, compilation and
evaluations excluded; on a GPU a "core" is the device) per process and summed over the
processes of a phase, beside the archived CPU runs of the same model (results/, one core each);
the cell's test results at the validation-selected step (the alpha-length protocol's
`run_result`) beside the CPU seeds', judged by the rule of docs/benchmarks.md section 9.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
CARRIED = ROOT / ".gpu"  # what `prepare` leaves for the device call to carry (.gitignore)
DEBIAN_FMNIST = pathlib.Path("/usr/share/datasets/fashion-mnist")
CONFIG = "configs/study/fmnist_vit.py"
RECIPE = "validation=5000,eval_points=20,epochs=40,input=memory"  # the alpha-length study's
S16 = ("--config.model.width=384", "--config.model.depth=12", "--config.model.mlp_dim=1536",
       "--config.model.num_heads=6")
# The CPU runs of the same model (relu alpha 1, qk-LN) archived by the Fashion-MNIST study (any
# length of training) and by the alpha-length study (this recipe)
FMNIST_RUNS = "fmnist/runs/fmnist_vit-Ti-p{patch}-relu-a1-qk_norm-nogated-e*"
ALPHA_LENGTH_RUNS = "alpha_length/runs/fmnist_vit-Ti-p{patch}-relu-a1-qk_norm-nogated-e40-val5000-ev20-seed*"
IMG_PER_SEC = "img/sec/core"
GRACE_SECONDS = 60  # after SIGTERM, for every trainer of a phase to save and exit
MARGIN = 0.006  # test prec@1, the pipelines' rule (docs/benchmarks.md 7b)


@dataclasses.dataclass(frozen=True)
class Phase:
  config: str  # CONFIG's argument, without the seed
  seeds: tuple[int, ...]  # one trainer process per seed, all at once
  seconds: float  # deadline from the phase's start
  overrides: tuple[str, ...] = ()
  cpu_runs: tuple[str, ...] = ()  # globs under results/: the archived CPU runs of this model


PHASES = {
    "cell": Phase(f"patch=7,attention=relu,alpha=1,{RECIPE}", (0, 1, 2), 250,
                  cpu_runs=(ALPHA_LENGTH_RUNS.format(patch=7),)),
    "L49": Phase(f"patch=4,{RECIPE}", (0,), 45,
                 cpu_runs=(FMNIST_RUNS.format(patch=4), ALPHA_LENGTH_RUNS.format(patch=4))),
    "L196": Phase(f"patch=2,{RECIPE}", (0,), 45,
                  cpu_runs=(FMNIST_RUNS.format(patch=2), ALPHA_LENGTH_RUNS.format(patch=2))),
    "L196x4": Phase(f"patch=2,{RECIPE}", (0, 1, 2, 3), 60,
                    cpu_runs=(FMNIST_RUNS.format(patch=2), ALPHA_LENGTH_RUNS.format(patch=2))),
    "S16_224": Phase(f"patch=16,res=224,{RECIPE}", (0,), 75, overrides=S16),
}


# ----------------------------------------------------------------------------- prepare (here)

def prepare() -> None:
  (CARRIED / "fashion-mnist").mkdir(parents=True, exist_ok=True)
  for path in sorted(DEBIAN_FMNIST.glob("*.gz")):
    shutil.copy2(path, CARRIED / "fashion-mnist" / path.name)
  if len(list((CARRIED / "fashion-mnist").glob("*.gz"))) != 4:
    sys.exit(f"{DEBIAN_FMNIST} lacks Fashion-MNIST's four IDX files: apt-get install "
             "dataset-fashion-mnist")
  import ml_collections  # the version this checkout's venv runs with
  version = getattr(ml_collections, "__version__", None)
  spec = f"ml_collections=={version}" if version else "ml_collections"
  subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                  "--only-binary=:all:", "-d", str(CARRIED / "wheels"), spec], check=True)
  size = sum(p.stat().st_size for p in CARRIED.rglob("*") if p.is_file()) / 2**20
  print(f"{CARRIED}: {size:.1f} MiB; on the device: carry ['.gpu'], "
        'python3 benchmarks/gpu_train.py run --out "$OUT"')


# ----------------------------------------------------------------------------- run (there)

def _environment() -> dict[str, str]:
  """The trainers' environment: ml_collections from the carried wheel where it is missing,
  GPU memory allocated as used (the processes of a phase share the device)."""
  env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "PYTHONUNBUFFERED": "1",
         "TF_CPP_MIN_LOG_LEVEL": "3"}
  paths = [str(ROOT)]
  try:
    import ml_collections  # noqa: F401
  except ImportError:
    site = pathlib.Path(tempfile.gettempdir()) / "gpu_train_site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                    "--target", str(site), *map(str, (CARRIED / "wheels").glob("*.whl"))],
                   check=True)
    paths.append(str(site))
    sys.path.append(str(site))
  env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
  return env


def _place_data() -> None:
  """The IDX files where the memory path reads them by default (root on the GPU machine)."""
  if len(list(DEBIAN_FMNIST.glob("*.gz"))) == 4:
    return
  carried = sorted((CARRIED / "fashion-mnist").glob("*.gz"))
  if len(carried) != 4:
    sys.exit(f"Neither {DEBIAN_FMNIST} nor {CARRIED / 'fashion-mnist'} holds Fashion-MNIST: "
             "run `python benchmarks/gpu_train.py prepare` here and carry .gpu")
  DEBIAN_FMNIST.mkdir(parents=True, exist_ok=True)
  for path in carried:
    shutil.copy2(path, DEBIAN_FMNIST / path.name)


def _records(workdir: pathlib.Path) -> list[dict]:
  path = workdir / "metrics.jsonl"
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_phase(name: str, phase: Phase, root: pathlib.Path, env: dict[str, str],
              config_suffix: str) -> dict:
  """Starts one trainer per seed, waits for them or the deadline (then SIGTERM: they save and
  exit at their next step; SIGKILL GRACE_SECONDS later), returns what each did."""
  start = time.monotonic()
  procs = {}
  for seed in phase.seeds:
    workdir = root / f"{name}-seed{seed}"
    config = f"{CONFIG}:{phase.config}{config_suffix},seed={seed}"
    log = (root / f"{name}-seed{seed}.log").open("w")
    procs[seed] = (workdir, log, subprocess.Popen(
        [sys.executable, "-m", "big_vision_relu.train", "--config", config, "--workdir",
         str(workdir), *phase.overrides], cwd=ROOT, env=env, stdout=log,
        stderr=subprocess.STDOUT))
  while time.monotonic() - start < phase.seconds and any(
      p.poll() is None for _, _, p in procs.values()):
    time.sleep(1)
  for _, _, proc in procs.values():
    if proc.poll() is None:
      proc.send_signal(signal.SIGTERM)
  processes, grace = [], time.monotonic() + GRACE_SECONDS
  for seed, (workdir, log, proc) in procs.items():
    try:
      proc.wait(timeout=max(0.0, grace - time.monotonic()))
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
    log.close()
    processes.append({"seed": seed, "returncode": proc.returncode,
                      "log_tail": pathlib.Path(log.name).read_text()[-2000:],
                      "records": _records(workdir)})
  wall = time.monotonic() - start
  print(f"{name}: {wall:.0f} s, exit {[p['returncode'] for p in processes]}", flush=True)
  return {"config": f"{CONFIG}:{phase.config}{config_suffix}", "overrides": list(phase.overrides),
          "deadline_s": phase.seconds, "wall_s": round(wall, 1), "processes": processes}


def run(out: pathlib.Path, names: list[str], config_suffix: str, time_scale: float) -> None:
  env = _environment()
  _place_data()
  environment = subprocess.run(
      [sys.executable, "-c", "import sys, jax; print(sys.version.split()[0], 'jax', "
       "jax.__version__, jax.devices()[0].device_kind, len(jax.devices()))"],
      env=env, capture_output=True, text=True, check=True).stdout.strip()
  results = {"environment": environment, "phases": {}}
  print(environment, flush=True)
  out.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(prefix="gpu_train_") as root:
    for name in names:
      phase = dataclasses.replace(PHASES[name], seconds=PHASES[name].seconds * time_scale)
      results["phases"][name] = run_phase(name, phase, pathlib.Path(root), env, config_suffix)
      (out / "runs.json").write_text(json.dumps(results))  # what is done survives a timeout
  text = summary(results)
  (out / "summary.md").write_text(text)
  print(text, end="")


# ----------------------------------------------------------------------------- summary

def _median_rate(records: list[dict]) -> float | None:
  rates = [r[IMG_PER_SEC] for r in records if IMG_PER_SEC in r]
  return statistics.median(rates) if rates else None


def _cpu_rate(patterns: tuple[str, ...]) -> tuple[float | None, str]:
  """The fastest CPU's median over its archived runs of their median img/sec/core (the best
  CPU baseline: the archives' CPUs differ by up to ~2x per core), and that CPU."""
  by_cpu = collections.defaultdict(list)
  for pattern in patterns:
    for run in sorted((ROOT / "results").glob(pattern)):
      rate = _median_rate(_records(run))
      if rate is not None:
        by_cpu[json.loads((run / "provenance.json").read_text())["machine"]["cpu"]].append(rate)
  if not by_cpu:
    return None, ""
  cpu, rates = max(by_cpu.items(), key=lambda item: statistics.median(item[1]))
  return statistics.median(rates), f"{cpu}, n = {len(rates)}"


def _cell_lines(phase: dict) -> list[str]:
  sys.path.insert(0, str(ROOT))
  from big_vision_relu.experiments.studies.alpha_length import protocol
  cpu, gpu = [], []
  for seed in protocol.SEEDS:
    path = ROOT / "results" / ALPHA_LENGTH_RUNS.format(patch=7).replace("seed*", f"seed{seed}")
    if path.exists():
      cpu.append(protocol.run_result(_records(path)).test_at_best)
  lines = ["", "| cell seed | steps | GPU: test at the selected step | final test |",
           "|---|---|---|---|"]
  for process in phase["processes"]:
    records = process["records"]
    steps = max((r["step"] for r in records), default=0)
    try:
      result = protocol.run_result(records)
    except ValueError:
      lines.append(f"| {process['seed']} | {steps} | - | - |")
      continue
    if result.evaluations == 21:  # finished: every evaluation of the recipe
      gpu.append(result.test_at_best)
    lines.append(f"| {process['seed']} | {steps} | {result.test_at_best:.4f} "
                 f"({result.evaluations} evaluations) | {result.test_final:.4f} |")
  lines += ["", f"CPU seeds (archived): {', '.join(f'{v:.4f}' for v in cpu) or 'none'}",
            cell_comparison(gpu, cpu)]
  return lines


def cell_comparison(gpu: list[float], cpu: list[float]) -> str:
  """The rule of docs/benchmarks.md section 9 on the GPU and CPU seeds' test results."""
  sys.path.insert(0, str(ROOT / "tools"))
  from pipeline_agreement import interval, verdict  # section 7b's rule, the same margin
  if len(gpu) < 2 or len(cpu) < 2:
    return f"Not judged: {len(gpu)} finished GPU seeds, {len(cpu)} CPU seeds (2 a side needed)."
  d, low, high = interval(gpu, cpu)
  inside = min(cpu) <= statistics.fmean(gpu) <= max(cpu)
  return (f"GPU - CPU: {100 * d:+.2f} points, Welch 90% [{100 * low:+.2f}, {100 * high:+.2f}]: "
          f"**{verdict(low, high, MARGIN)}** (margin {100 * MARGIN:.1f} points); the GPU mean "
          f"is {'inside' if inside else 'outside'} the CPU seeds' range")


def summary(results: dict) -> str:
  lines = [f"# benchmarks/gpu_train.py: {results['environment']}", "",
           "| phase | processes | steps (each) | img/sec/core, each (median) | all processes | "
           "CPU img/sec/core (fastest archived CPU) | GPU all / CPU |", "|---|---|---|---|---|---|---|"]
  for name, phase in results["phases"].items():
    rates = [_median_rate(p["records"]) for p in phase["processes"]]
    steps = [max((r["step"] for r in p["records"]), default=0) for p in phase["processes"]]
    total = sum(r for r in rates if r is not None) if any(r is not None for r in rates) else None
    cpu, cpus = _cpu_rate(PHASES[name].cpu_runs)
    lines.append(
        f"| {name} | {len(rates)} | {', '.join(map(str, steps))} | "
        f"{', '.join('-' if r is None else f'{r:,.0f}' for r in rates)} | "
        f"{'-' if total is None else f'{total:,.0f}'} | "
        f"{'-' if cpu is None else f'{cpu:,.0f} ({cpus})'} | "
        f"{'-' if cpu is None or total is None else f'{total / cpu:.1f}x'} |")
  if "cell" in results["phases"]:
    lines += _cell_lines(results["phases"]["cell"])
  return "\n".join(lines) + "\n"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  commands = parser.add_subparsers(dest="command", required=True)
  commands.add_parser("prepare", help="here: copy the data and the wheel into .gpu/")
  runner = commands.add_parser("run", help="there: train the phases, write OUT/")
  runner.add_argument("--out", required=True, type=pathlib.Path)
  runner.add_argument("--phases", default=",".join(PHASES),
                      help=f"comma-separated, in this order (default: {','.join(PHASES)})")
  runner.add_argument("--time_scale", type=float, default=1.0,
                      help="multiplies every phase's deadline (a trial on a slower machine)")
  runner.add_argument("--config_suffix", default="",
                      help="appended to every phase's config argument: ',runlocal=True' tries "
                           "the phases on a CPU (4 steps on slices of the data)")
  summarizer = commands.add_parser("summary", help="the tables from DIR/runs.json")
  summarizer.add_argument("dir", type=pathlib.Path)
  args = parser.parse_args()
  if args.command == "prepare":
    prepare()
  elif args.command == "run":
    names = args.phases.split(",")
    unknown = sorted(set(names) - set(PHASES))
    if unknown:
      parser.error(f"unknown phases {unknown}: choose from {', '.join(PHASES)}")
    run(args.out, names, args.config_suffix, args.time_scale)
  else:
    print(summary(json.loads((args.dir / "runs.json").read_text())), end="")


if __name__ == "__main__":
  main()
