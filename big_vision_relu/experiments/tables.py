"""A sweep's rows as tables: a CSV (one line per run, exact values) and a Markdown report.

The Markdown file has the runs' table and a summary line; when the runs have a seed, a table
of the seed groups ("Mean ± std over seeds", `stats.group_rows`); for fig2-4 sweeps, per column
of the figure, the accuracy as a table of series (attention and the arguments other than alpha
that vary) x alpha, the figure in numbers; for fig4 sweeps the gate's cost: the core hours of
each finished gated run over those of the same run without the gate (`stats.gate_cost_ratios`),
per column value of the figure and over all pairs.
"""
from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from typing import Any

from big_vision_relu.experiments import sweep as sweep_lib
from big_vision_relu.experiments.run_status import (CORE_HOURS, STATUSES, TRAINING_LOSS, Row,
                                                    spec_metrics)
from big_vision_relu.experiments.stats import (Group, Stat, gate_cost_ratios, group_rows,
                                               has_seeds, ordered, panel_values, summarize)

_MARKDOWN_HEADERS = {"i1k/prec@1": "i1k acc", "test/prec@1": "test acc",
                     "fewshot/10shot_avg": "10-shot avg", CORE_HOURS: "core hours",
                     TRAINING_LOSS: "train loss"}


def _arg_keys(items: Sequence[Row | Group]) -> list[str]:
  keys: dict[str, None] = {}
  for item in items:
    keys.update(dict.fromkeys(item.args))
  return list(keys)


def _cell(value: Any) -> str:
  if value is None:
    return ""
  if isinstance(value, float):
    return repr(value)
  return str(value)


def to_csv(rows: Sequence[Row], spec: sweep_lib.FigureSpec) -> str:
  """CSV: run_id, dataset, the args, status, step, total_steps, `spec_metrics(spec)` (exact
  values; empty when unknown, never logged or missing)."""
  keys = _arg_keys(rows)
  metrics = spec_metrics(spec)
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  writer.writerow(["run_id", "dataset", *keys, "status", "step", "total_steps", *metrics])
  for row in rows:
    writer.writerow([row.run_id, row.dataset, *(_cell(row.args.get(k)) for k in keys),
                     row.status, _cell(row.step), _cell(row.total_steps),
                     *(_cell(row.value(m)) for m in metrics)])
  return out.getvalue()


def _decimals(metric: str | None, value: float) -> int:
  """4; for core hours 1, or more below 1 core hour so that 2 significant digits show."""
  if metric != CORE_HOURS:
    return 4
  return 1 if value >= 1 or value <= 0 else 1 - math.floor(math.log10(value))


def _markdown_value(metric: str, value: float | None) -> str:
  return "-" if value is None else f"{value:.{_decimals(metric, value)}f}"


def _stat_cell(stat: Stat | None, metric: str | None = None) -> str:
  """'mean ± std (n)', 'mean (1)', or '-' without values; as many decimals as a run's value."""
  if stat is None:
    return "-"
  decimals = _decimals(metric, stat.mean)
  spread = "" if stat.std is None else f" ± {stat.std:.{decimals}f}"
  return f"{stat.mean:.{decimals}f}{spread} ({stat.n})"


def _markdown_arg(value: Any) -> str:
  return f"{value:g}" if isinstance(value, float) else str(value)


def _table_lines(header: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
  """A Markdown table: the header, its rule, a line per cells of `body`."""
  return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
          *("| " + " | ".join(cells) + " |" for cells in body)]


def to_markdown(rows: Sequence[Row], spec: sweep_lib.FigureSpec, title: str = "", *,
                alpha_tables: bool = False, gate_cost: bool = False) -> str:
  """A Markdown table of the runs with a summary line: accuracies and losses to 4 decimals, '-'
  where no value was logged, step 'n/total' (or 'n' when the total is unknown). Then, when the
  runs have a seed, the groups' mean ± std over seeds, and with `gate_cost` (fig4) the gate's
  cost in core hours."""
  keys = _arg_keys(rows)
  metrics = spec_metrics(spec)
  counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
  lines = [f"# {title}", ""] if title else []
  diverged = f"{counts['diverged']} diverged, " if counts["diverged"] else ""
  lines += [(f"{len(rows)} runs: {counts['finished']} finished, {counts['running']} running, "
             f"{diverged}{counts['missing']} missing. Values are the last logged ones."), ""]
  header = ["run", "dataset", *keys, "status", "step", *(_MARKDOWN_HEADERS.get(m, m)
                                                          for m in metrics)]
  cells = []
  for row in rows:
    if row.step is None:
      step = "-"
    else:
      step = f"{row.step}/{row.total_steps}" if row.total_steps else str(row.step)
    cells.append([row.run_id, row.dataset, *(_markdown_arg(row.args.get(k, "")) for k in keys),
                  row.status, step, *(_markdown_value(m, row.value(m)) for m in metrics)])
  lines += _table_lines(header, cells)
  if has_seeds(rows):
    lines += _seeds_markdown(rows, metrics)
  if alpha_tables:
    lines += _alpha_markdown(rows, spec)
  if gate_cost:
    lines += _gate_cost_markdown(rows, spec.panel_key)
  return "\n".join(lines) + "\n"


def _finished_cell(group: Group, metric: str) -> str:
  """The finished runs' Stat; 'diverged' when none finished and one diverged."""
  stat = summarize([v for r in group.rows
                    if r.status == "finished" and (v := r.value(metric)) is not None])
  if stat is None and any(r.status == "diverged" for r in group.rows):
    return "diverged"
  return _stat_cell(stat, metric)


def _alpha_markdown(rows: Sequence[Row], spec: sweep_lib.FigureSpec) -> list[str]:
  """Per dataset and column of the figure: accuracy, series (attention + the other varying
  args) x alpha. Softmax takes no alpha: its value is in its run's alpha column only."""
  groups = group_rows(rows)
  alphas = sorted({g.args["alpha"] for g in groups})
  lines = ["", f"## {spec.accuracy_label} by alpha", "",
           "Finished runs only: mean ± sample std over seeds (how many); '-': none finished."]
  for dataset in ordered(g.dataset for g in groups):
    for panel in panel_values([g for g in groups if g.dataset == dataset], spec.panel_key):
      panel_groups = [g for g in groups
                      if g.dataset == dataset and g.args[spec.panel_key] == panel]
      varying = [k for k in _arg_keys(panel_groups) if k not in ("alpha", spec.panel_key)
                 and len({_markdown_arg(g.args[k]) for g in panel_groups}) > 1]
      series: dict[tuple[str, ...], dict[float, Group]] = {}
      for group in panel_groups:
        label = tuple(f"{k}={_markdown_arg(group.args[k])}" if k != "attention"
                      else group.args[k] for k in varying)
        series.setdefault(label, {})[group.args["alpha"]] = group
      cells = [[", ".join(label), *(_finished_cell(by_alpha[a], spec.accuracy_metric)
                                    if a in by_alpha else "" for a in alphas)]
               for label, by_alpha in series.items()]
      title = spec.panel_title.format(dataset=dataset, value=panel)
      lines += ["", f"### {title}", "",
                *_table_lines([", ".join(varying), *(f"alpha {_markdown_arg(a)}"
                                                     for a in alphas)], cells)]
  return lines


def _seeds_markdown(rows: Sequence[Row], metrics: Sequence[str]) -> list[str]:
  """The table of the groups of runs that differ only in the seed."""
  groups = group_rows(rows)
  keys = _arg_keys(groups)
  header = ["dataset", *keys, "status", "seeds", *(_MARKDOWN_HEADERS.get(m, m) for m in metrics)]
  cells = [[group.dataset, *(_markdown_arg(group.args.get(k, "")) for k in keys), group.status,
            str(len(group.rows)), *(_stat_cell(group.stat(m), m) for m in metrics)]
           for group in groups]
  return ["", "## Mean ± std over seeds", "",
          (f"{len(groups)} groups of runs that differ only in the seed. A cell is the mean ± "
           "sample std (ddof=1) over the group's runs that logged the metric (how many); a group "
           "is finished when all its runs are."), "", *_table_lines(header, cells)]


def _gate_cost_markdown(rows: Sequence[Row], panel_key: str) -> list[str]:
  """The core hours of the gated runs over those without the gate, per value of `panel_key`."""
  ratios = gate_cost_ratios(rows)
  cells = [[_markdown_arg(value),
            _stat_cell(summarize([q for r, q in ratios if r.args[panel_key] == value]))]
           for value in panel_values(rows, panel_key)]
  cells.append(["all", _stat_cell(summarize([q for _, q in ratios]))])
  return ["", "## Gate cost: core hours with gate / without gate", "",
          ("Over the pairs of finished runs identical but for the gate: mean ± sample std "
           "(number of pairs). Core hours are the trainers' own count over all their starts, "
           "so a pair that trained in different sessions also compares machines, allocators "
           "and load (each run's starts are in its launches.jsonl, where it has one); the "
           "gate's step time alone is timed in docs/benchmarks.md, section 2b."), "",
          *_table_lines([panel_key, "with / without gate"], cells)]
