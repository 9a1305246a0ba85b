"""A pool of worker threads fed by a source that a finished item can refill: the study's
runs, where a finished run's result may open more (a gated plan: `study.train_open_phases`)."""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any


def work_pool(workers: int, take: Callable[[], Sequence[Any]],
              work: Callable[[Any, int], None], stopping: threading.Event) -> None:
  """`work(item, worker index)` on `workers` threads for every item `take()` returns.

  `take` is called at the start, and again when a worker finds nothing queued and an item has
  finished since the last call: items that a finished one makes possible start at once, on
  every idle worker (an idle worker waits while others work). Returns when nothing is queued or
  in work and `take` has nothing new, or once `stopping` is set (items in work finish, no new
  one starts). An exception in `take` or `work` also starts nothing new; it is raised here once
  the items in work have finished.
  """
  todo: list[Any] = []
  in_work, ask = 0, True
  errors: list[BaseException] = []
  changed = threading.Condition()

  def next_item() -> Any | None:
    nonlocal in_work, ask
    with changed:
      while not stopping.is_set() and not errors:
        if not todo and ask:
          ask = False
          todo.extend(take())
        if todo:
          in_work += 1
          return todo.pop(0)
        if not in_work:
          return None
        changed.wait(timeout=1.0)  # a finished item notifies; the timeout sees `stopping`
      return None

  def worker(index: int) -> None:
    nonlocal in_work, ask
    try:
      while (item := next_item()) is not None:
        try:
          work(item, index)
        finally:
          with changed:
            in_work, ask = in_work - 1, True
            changed.notify_all()
    except BaseException as error:  # noqa: BLE001  (raised below, in the calling thread)
      with changed:
        errors.append(error)
        changed.notify_all()

  threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  if errors:
    raise errors[0]
