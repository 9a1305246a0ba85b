"""Training-state checkpoints: a thin wrapper over orbax's `CheckpointManager`.

What orbax provides (and this module only configures): asynchronous saving (`save` returns
once the arrays are copied off the devices, so the caller may donate them to the next step;
files are written in a background thread), atomic step directories (a step appears only
once fully written: tmp-dir rename locally, a commit marker on GCS), sharded
`jax.Array`s written and read per shard by each process, and the save/keep policies.

Layout: `<directory>/<step>/{state,extra}`: `state` is any pytree of arrays (params,
optimizer state, step, PRNG keys; bfloat16 and typed keys round-trip exactly), `extra` a
small JSON dict (e.g. the data position or cumulative core hours).

Policies:

- save when `step % save_interval_steps == 0`, or when `force=True` (the trainer forces
  the step at which every process agreed on a preemption notice: see preemption.py; orbax's
  own preemption policy is not used, as it relies on JAX's C++ SIGTERM handler, which the
  trainer's Python handler replaces);
- keep the newest `keep_last` steps, plus every step that is a multiple of
  `keep_every_steps` (big_vision's `keep_ckpt_steps`), which is never deleted.

`Checkpointer.restore_latest` skips a newest checkpoint that cannot be read (truncated
or missing files): it logs a warning naming it, restores the previous one, and then moves the
unreadable step directory aside to `<step>.corrupt-<unix time>` (orbax ignores that name),
so training can save that step again. Nothing is moved unless an older step restored, and
nothing is ever deleted by this fallback.
Python may print `Exception ignored ... RuntimeError: Event loop is closed` around that
warning: tensorstore's other reads of the unreadable step, still in flight when orbax's restore
failed and closed its event loop, finishing into it. They are harmless (tests/test_inspect.py
sees them, and only them, when `inspect.load_run` reads a truncated step).

Multi-host: every process must call `Checkpointer.save`,
`Checkpointer.restore`, `Checkpointer.restore_latest`,
`Checkpointer.wait_until_finished` and `Checkpointer.close` in the same order
with the same steps (orbax synchronises the processes inside them; process 0 writes the
metadata and finalises the step; each process writes its own shards). All processes must see
the same directory (e.g. a `gs://` path). Limitation: if only SOME processes fail to read
their shards of a checkpoint, orbax's post-restore barrier times out with an error instead of
falling back, because the processes no longer agree.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from orbax.checkpoint import checkpoint_managers as policies

# Reading a damaged checkpoint surfaces as ValueError (tensorstore/OCDBT errors, bad JSON) or
# OSError (missing files). Anything else is a bug and must propagate.
_READ_ERRORS = (ValueError, OSError)


class Restored(NamedTuple):
  """A restored checkpoint."""

  step: int
  state: Any
  extra: dict[str, Any]


class Checkpointer:
  """Saves and restores `(state, extra)` per step in `directory` with orbax."""

  def __init__(
    self,
    directory: str | os.PathLike[str],
    *,
    save_interval_steps: int,
    keep_last: int = 3,
    keep_every_steps: int | None = None,
    async_save: bool = True,
  ) -> None:
    """Opens (and creates) the checkpoint directory.

    Args:
      directory: where step directories live, local or `gs://`; the same on all hosts.
      save_interval_steps: `save` writes when `step % save_interval_steps == 0`.
      keep_last: how many newest checkpoints to keep (>= 1; 2+ leaves a fallback when
        the newest is damaged).
      keep_every_steps: if set, steps that are multiples of it are never deleted.
      async_save: write in a background thread (orbax's default); False blocks in `save`.
    """
    if save_interval_steps < 1:
      raise ValueError(f"save_interval_steps={save_interval_steps} must be >= 1")
    if keep_last < 1:
      raise ValueError(f"keep_last={keep_last} must be >= 1 (the newest is always kept)")
    if keep_every_steps is not None and keep_every_steps < 1:
      raise ValueError(f"keep_every_steps={keep_every_steps} must be >= 1 or None")
    keep: list[policies.PreservationPolicy] = [policies.LatestN(n=keep_last)]
    if keep_every_steps is not None:
      keep.append(policies.EveryNSteps(interval_steps=keep_every_steps))
    options = ocp.CheckpointManagerOptions(
      save_decision_policy=policies.FixedIntervalPolicy(save_interval_steps),
      preservation_policy=policies.AnyPreservationPolicy(keep),
      enable_async_checkpointing=async_save,
      create=True,
    )
    # orbax needs absolute paths (a relative --workdir is common on the command line); gs://
    # paths are absolute already.
    directory = os.fspath(directory)
    self._directory = epath.Path(directory if "://" in directory else os.path.abspath(directory))
    self._manager = ocp.CheckpointManager(
      self._directory, item_names=("state", "extra"), options=options
    )
    # Barrier names must be unique per call; this counts quarantine barriers.
    self._quarantines = 0

  @property
  def directory(self) -> epath.Path:
    return self._directory

  def all_steps(self) -> list[int]:
    """Finalised steps on disk, ascending."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def should_save(self, step: int) -> bool:
    """Whether `save(step, ...)` without `force` would write."""
    return self._manager.should_save(step)

  def save(
    self,
    step: int,
    state: Any,
    extra: dict[str, Any] | None = None,
    *,
    force: bool = False,
  ) -> bool:
    """Saves `state` and `extra` at `step` if due (or `force`); call every step.

    Returns whether a save started. A step that is already on disk is not rewritten
    (returns False), so forcing the final step after an interval save is harmless.
    """
    extra = {} if extra is None else extra
    try:
      json.dumps(extra)
    except TypeError as e:
      # Fail here, not later in orbax's background thread.
      raise ValueError(f"extra must be JSON-serialisable: {e}") from e
    if step in self._manager.all_steps():
      return False
    return self._manager.save(
      step,
      args=ocp.args.Composite(state=ocp.args.StandardSave(state), extra=ocp.args.JsonSave(extra)),
      force=force,
    )

  def restore(self, step: int, target: Any) -> Restored:
    """Restores `step` into the structure, dtypes and shardings of `target`.

    `target` is a pytree of `jax.ShapeDtypeStruct` (with `sharding`) or arrays, e.g.
    `jax.eval_shape` of the jitted, sharded init. Raises orbax's error if unreadable.
    """
    restored = self._manager.restore(
      step,
      args=ocp.args.Composite(state=ocp.args.StandardRestore(target), extra=ocp.args.JsonRestore()),
    )
    return Restored(step=step, state=restored.state, extra=dict(restored.extra))

  def restore_latest(self, target: Any) -> Restored | None:
    """Restores the newest readable checkpoint; None if there is none at all.

    Unreadable newer steps are skipped with a warning and, once an older step restored,
    moved aside (see the module docstring). Raises RuntimeError if no step is readable.
    """
    steps = self.all_steps()
    # Messages, not exception objects: those pin orbax's failed read coroutines (through
    # their tracebacks) for as long as the caller keeps the log records.
    failures: list[tuple[int, str]] = []
    for step in reversed(steps):
      try:
        restored = self.restore(step, target)
      except _READ_ERRORS as e:
        message = f"{type(e).__name__}: {e}"
        logging.warning(
          "Could not restore checkpoint step %d in %s (%s); trying an older one (any "
          "'RuntimeError: Event loop is closed' printed around this: that step's other "
          "reads; harmless).",
          step,
          self._directory,
          message,
        )
        failures.append((step, message))
        continue
      for bad_step, _ in failures:
        self._quarantine(bad_step)
      return restored
    if failures:
      details = "\n".join(f"  step {s}: {message}" for s, message in failures)
      raise RuntimeError(
        f"No checkpoint in {self._directory} could be restored (steps {steps}):\n"
        f"{details}\nIf every step fails with the same shape or structure error, the "
        "target (model / optimizer config) does not match these checkpoints; "
        "otherwise the files are damaged: move the step directories away to start over."
      )
    return None

  def _quarantine(self, step: int) -> None:
    """Moves an unreadable step directory aside (primary process), then re-lists steps."""
    path = self._directory / str(step)
    # '-' not '_': orbax would parse "<name>_<digits>" as a step number.
    moved = self._directory / f"{step}.corrupt-{int(time.time())}"
    if ocp.multihost.process_index() == 0:
      path.rename(moved)
      logging.warning("Moved unreadable checkpoint %s to %s.", path, moved)
    self._quarantines += 1
    ocp.multihost.sync_global_processes(f"big_vision_relu_quarantine_{self._quarantines}")
    self._manager.reload()

  def wait_until_finished(self) -> None:
    """Blocks until pending asynchronous saves (and their deletions) are on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases orbax's threads."""
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()


def _step_path(step_dir: epath.PathLike) -> epath.Path:
  """A step directory as orbax wants it: local paths absolute, gs:// ones as they are."""
  path = epath.Path(step_dir)
  return path if "://" in str(path) else path.absolute()


def _read_only(state_handler: ocp.CheckpointHandler) -> ocp.Checkpointer:
  """A checkpointer for one step's two items (so that orbax knows the layout and does not warn
  about it), the state read with `state_handler`."""
  return ocp.Checkpointer(ocp.CompositeCheckpointHandler(state=state_handler,
                                                         extra=ocp.JsonCheckpointHandler()))


def read_state(step_dir: epath.PathLike, sharding: jax.sharding.Sharding) -> Any:
  """The `state` saved in one step directory `<directory>/<step>`, read-only.

  For tools that inspect a checkpoint without the trainer's set-up (`big_vision_relu.inspect`):
  the target is the checkpoint's own tree, every array placed with `sharding`, so neither
  the model nor the optimizer is needed, whatever mesh wrote it. Raises ValueError or OSError
  if the step cannot be read; nothing on disk is changed.
  """
  path = _step_path(step_dir)
  with _read_only(ocp.StandardCheckpointHandler()) as checkpointer:
    metadata = checkpointer.metadata(path).item_metadata
    if metadata is None or metadata.get("state") is None:
      raise ValueError(f"{path} is not a checkpoint step with a 'state' item.")
    target = jax.tree.map(
      lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
      metadata["state"],
    )
    restored = checkpointer.restore(
      path, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
    )
  return restored.state


def read_params(step_dir: epath.PathLike, shardings: Callable[[Any], Any]) -> Any:
  """The `params` of the state saved in one step directory, read-only; nothing else of the state
  (the optimizer's) is read, so it costs the parameters' memory only.

  `shardings(abstract_params)` gives each parameter's sharding, from the checkpoint's own tree
  of `jax.ShapeDtypeStruct`s (e.g. sharding.tree_shardings with the run's strategy), so no model
  or optimizer is needed. Raises ValueError or OSError if the step cannot be read.
  """
  path = _step_path(step_dir)
  with _read_only(ocp.PyTreeCheckpointHandler()) as checkpointer:
    metadata = checkpointer.metadata(path).item_metadata
    if metadata is None or metadata.get("state") is None or "params" not in metadata["state"]:
      raise ValueError(f"{path} is not a checkpoint step with a 'state' item holding 'params'.")
    abstract = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype),
                            metadata["state"]["params"])
    target = {"params": jax.tree.map(
      lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
      abstract, shardings(abstract))}
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    restored = checkpointer.restore(path, args=ocp.args.Composite(
      state=ocp.args.PyTreeRestore(target, restore_args=restore_args, partial_restore=True)))
  return restored.state["params"]
