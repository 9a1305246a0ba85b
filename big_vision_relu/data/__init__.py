"""Data: TFDS datasets, the pp mini-language and the input pipelines.

- `builders`: offline TFDS datasets built from installed packages (`mnist5k`, `digits`).
- `datasets`: `get_builder` (offline datasets built on first use, others must be prepared),
  `num_examples`.
- `pp`: the pp mini-language, its registry and ops (incl. RandAugment).
- `input_pipeline`: resumable training batches, padded eval batches, `make_global_batch`.
- `mixup`: mixup inside the jitted step.
"""
