"""experiments/pool.py: a worker that finds nothing queued waits while others work and takes
what a finished item opens; a stop or an error starts nothing new."""
import threading

import pytest

from big_vision_relu.experiments import pool


def test_an_idle_worker_takes_what_a_finished_item_opens():
  """'fast' finishes while 'slow' works: its worker finds nothing (take gives nothing until
  'slow' is done), waits, and then trains one of the two items 'slow' opened, beside the other
  worker: both must reach a barrier of two. A worker that left when it found nothing would
  train both alone and break the barrier."""
  fast_done, trained, barrier = threading.Event(), [], threading.Barrier(2, timeout=20)
  calls = []

  def take():
    calls.append(sorted(item for item, _ in trained))
    if len(calls) == 1:
      return ["slow", "fast"]
    if "slow" in calls[-1] and not any(item in ("x", "y") for item, _ in trained):
      return ["x", "y"]
    return []

  def work(item, worker):
    if item == "slow":
      assert fast_done.wait(timeout=20)
    elif item in ("x", "y"):
      barrier.wait()
    trained.append((item, worker))
    if item == "fast":
      fast_done.set()

  pool.work_pool(2, take, work, threading.Event())
  assert sorted(item for item, _ in trained) == ["fast", "slow", "x", "y"]
  assert {worker for item, worker in trained if item in ("x", "y")} == {0, 1}
  # At the start, after 'fast' (nothing new), after 'slow' (x, y), then until nothing is new.
  assert calls[:3] == [[], ["fast"], ["fast", "slow"]] and len(calls) in (4, 5)


def test_a_stop_or_an_error_starts_nothing_new():
  stopping, trained = threading.Event(), []

  def stop_after_first(item, worker):
    trained.append(item)
    stopping.set()

  pool.work_pool(1, lambda: ["a", "b", "c"], stop_after_first, stopping)
  assert trained == ["a"]

  trained.clear()
  batches = iter([["a", "b"], ["c"]])

  def fail_on_a(item, worker):
    trained.append(item)
    if item == "a":
      raise ValueError("a failed")

  with pytest.raises(ValueError, match="a failed"):
    pool.work_pool(1, lambda: next(batches, []), fail_on_a, threading.Event())
  assert trained == ["a"]
  with pytest.raises(RuntimeError, match="the gate"):  # an error in take, too
    pool.work_pool(2, lambda: (_ for _ in ()).throw(RuntimeError("the gate")), fail_on_a,
                   threading.Event())
