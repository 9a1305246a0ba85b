"""Runs a command on one CPU core, niced, and sends it SIGTERM when its parent dies.

    python -m big_vision_relu.experiments.pinned --core 0 --niceness 10 -- COMMAND [ARG...]

The study starts every trainer through this file, run from its own checkout whatever commit the
trainers are pinned to (`study.PINNED_LAUNCHER`), so it imports nothing of big_vision_relu. The
set-up happens here, in a fresh single-threaded process that then execs COMMAND (affinity,
niceness and the parent-death signal survive exec), and not between fork and exec of the study
itself: the study has threads, and Python code run in the child of a threaded process before
exec (subprocess's `preexec_fn`) is not fork-safe (JAX, when loaded, warns of a possible
deadlock).
"""
from __future__ import annotations

import ctypes
import os
import signal

from absl import app, flags

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def pin(core: int | None, niceness: int) -> None:
  """Pins this process to `core` (None: keeps its CPUs), adds `niceness` to its niceness, and
  has the kernel send it SIGTERM when the thread that started it exits."""
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
    errno = ctypes.get_errno()
    raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
  if core is not None:
    os.sched_setaffinity(0, {core})
  os.nice(niceness)


def main(argv: list[str]) -> None:
  command = argv[1:]  # absl stops parsing flags at '--'
  if not command:
    raise app.UsageError("No command to run: python -m big_vision_relu.experiments.pinned "
                         "[--core N] [--niceness N] -- COMMAND [ARG...]")
  pin(FLAGS.core, FLAGS.niceness)
  os.execvp(command[0], command)


if __name__ == "__main__":
  FLAGS = flags.FLAGS
  flags.DEFINE_integer("core", None, "The CPU core to run on (default: the CPUs it has).")
  flags.DEFINE_integer("niceness", 0, "Added to the command's niceness.")
  app.run(main)
