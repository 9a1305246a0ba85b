"""The studies, one unit each: a module, or a package when it has several (its rules, its
report), that sets `PLAN = plans.Plan(...)` (experiments/plans.py says what a plan holds).

The core finds a unit by its name (`plans.load`, `--plan NAME`, `bash launch/study.sh NAME`)
and imports nothing else of it; this package imports none of them. To add a study, add a unit:
its grid (named sweeps, each a function listing its runs), its run order (phases), the datasets
it reads, and, when it has them, its gate and its report module; a sweep file in configs/ per
sweep makes it listable (`python -m big_vision_relu.experiments.sweep FILE --list`).

- `repro`: the miniature reproduction on MNIST-5k (docs/reproduction.md 2);
- `fmnist`: the Fashion-MNIST study (docs/reproduction.md 1);
- `alpha_length`: the best alpha as a function of the sequence length (docs/alpha_length.md).
"""
