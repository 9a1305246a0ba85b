"""pp: the preprocessing mini-language (`decode|resize(224)|value_range(-1, 1)|...`).

`get_preprocess_fn(pp_str)` returns example-dict -> example-dict on tf tensors (one example).
Importing this package registers the built-in ops; `register(name)` adds more.
Ops: see `registered_ops()`; image ops in `ops_image`, labels/keys in `ops_general`,
`randaug` in `randaug`.
"""
from big_vision_relu.data.pp import ops_general, ops_image, randaug  # noqa: F401  (register)
from big_vision_relu.data.pp.common import RNG_KEY
from big_vision_relu.data.pp.registry import (Example, PPFn, get_preprocess_fn, parse, register,
                                              registered_ops)

__all__ = ["RNG_KEY", "Example", "PPFn", "get_preprocess_fn", "parse", "register",
           "registered_ops"]
