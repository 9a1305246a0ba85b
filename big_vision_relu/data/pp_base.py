"""What the pp mini-language's tf.data ops (`pp/`) and JAX ops (`jax_pp`) share: the syntax,
and the ops' handling of example dicts (keys, sizes, `keep`, `drop`), which is the same for tf
tensors and jax arrays.

A pp string chains ops with `|`, e.g. `decode|resize(224)|value_range(-1, 1)|keep("image")`.
Each op is `name` or `name(args...)` with Python-literal arguments (numbers, strings, tuples,
lists, dicts, True/False/None; keyword arguments allowed). The string is parsed with `ast`
and the arguments evaluated with `ast.literal_eval`: nothing is ever `eval`-ed.
"""
import ast
from collections.abc import Mapping
from typing import Any


def _flatten_pipe(node: ast.expr) -> list[ast.expr]:
  """`a|b|c` parses as ((a|b)|c): returns [a, b, c]."""
  if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
    return _flatten_pipe(node.left) + _flatten_pipe(node.right)
  return [node]


def parse(pp_str: str) -> list[tuple[str, tuple, dict]]:
  """Parses a pp string into [(op_name, args, kwargs), ...] (ValueError if malformed)."""
  if not pp_str.strip():
    raise ValueError("Empty pp string: give at least one op, e.g. 'decode'.")
  try:
    tree = ast.parse(pp_str.strip(), mode="eval")
  except SyntaxError as e:
    raise ValueError(f"pp string {pp_str!r} is not 'op|op(args)|...': {e.msg}") from None
  ops = []
  for node in _flatten_pipe(tree.body):
    text = ast.get_source_segment(pp_str.strip(), node)
    if isinstance(node, ast.Name):
      ops.append((node.id, (), {}))
      continue
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
      raise ValueError(f"pp op {text!r} in {pp_str!r} must be `name` or `name(literal args)`")
    if any(k.arg is None for k in node.keywords):
      raise ValueError(f"pp op {text!r}: **kwargs unpacking is not supported")
    try:
      args = tuple(ast.literal_eval(a) for a in node.args)
      kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except ValueError:
      raise ValueError(f"pp op {text!r} in {pp_str!r}: arguments must be Python literals "
                       "(numbers, quoted strings, tuples, lists, dicts, True/False/None)"
                       ) from None
    ops.append((node.func.id, args, kwargs))
  return ops


def get_key(example: Mapping[str, Any], key: str, op_name: str) -> Any:
  """`example[key]`, or ValueError naming the op and the keys that exist."""
  if key not in example:
    raise ValueError(f"pp op {op_name} reads key {key!r}, but the example only has "
                     f"{sorted(example)}; pass key=... or fix the op order")
  return example[key]


def as_size(size: int | tuple[int, int] | list[int], op_name: str) -> tuple[int, int]:
  """An int or (height, width) pair -> (height, width) of positive ints."""
  pair = (size, size) if isinstance(size, int) else tuple(size)
  if len(pair) != 2 or not all(isinstance(s, int) and s > 0 for s in pair):
    raise ValueError(f"pp op {op_name}: size must be a positive int or (height, width), "
                     f"got {size!r}")
  return pair


# inception_crop's aspect ratios (box width / height), both pipelines (TF's sampler's default).
CROP_RATIOS = (0.75, 1.33)


def check_area(area_min: float, area_max: float) -> None:
  """The area range (percent of the image) of `inception_crop` and its JPEG variant."""
  if not 0 < area_min <= area_max <= 100:
    raise ValueError(f"inception crop needs 0 < area_min <= area_max <= 100 (percent), got "
                     f"{area_min}, {area_max}")


def check_keys(op_name: str, keys: tuple[str, ...]) -> None:
  """The arguments of `keep` / `drop`: one or more key names."""
  if not keys or not all(isinstance(k, str) for k in keys):
    raise ValueError(f"{op_name} needs one or more key names as strings, got {keys!r}")


def keep(example: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
  """Only `keys` (each must exist), plus pipeline keys starting with '_' (e.g. '_rng')."""
  for k in keys:
    get_key(example, k, "keep")
  return {k: v for k, v in example.items() if k in keys or k.startswith("_")}


def drop(example: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
  """All but `keys` (each must exist)."""
  for k in keys:
    get_key(example, k, "drop")
  return {k: v for k, v in example.items() if k not in keys}
