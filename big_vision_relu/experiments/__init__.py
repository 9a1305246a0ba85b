"""Experiment tooling: sweeps, studies, reports, cost estimates, comparisons and baselines.

Built on the library (`big_vision_relu`), which never imports this package: training,
evaluation and the models do not depend on how experiments are planned or reported. Config
files may import it (`recipes` for shared pieces, `sweep` for their runs).
"""
