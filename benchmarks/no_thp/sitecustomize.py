"""Disables transparent huge pages for this process and its children: put this directory on
PYTHONPATH (Python imports `sitecustomize` at start), as docs/benchmarks.md section 3 does to
time a config without huge pages on a machine whose kernel gives them to every process."""
import ctypes

PR_SET_THP_DISABLE = 41  # <linux/prctl.h>; inherited by children, kept across execve
if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
  raise OSError(ctypes.get_errno(), "prctl(PR_SET_THP_DISABLE) failed")
