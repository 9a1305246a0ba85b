"""The pp mini-language's syntax, shared by the tf.data ops (`pp/`) and the JAX ops (`jax_pp`).

A pp string chains ops with `|`, e.g. `decode|resize(224)|value_range(-1, 1)|keep("image")`.
Each op is `name` or `name(args...)` with Python-literal arguments (numbers, strings, tuples,
lists, dicts, True/False/None; keyword arguments allowed). The string is parsed with `ast`
and the arguments evaluated with `ast.literal_eval`: nothing is ever `eval`-ed.
"""
import ast


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
