"""Data: datasets, the pp mini-language and the two input pipelines (`inputs` picks one).

- `inputs`: the interface the trainer and the evaluators use; `config.input.pipeline` picks
  tfds (TFDS + tf.data) or memory (numpy arrays, pp in JAX; no TensorFlow).
- `builders`, `datasets`: TFDS datasets: the offline ones built from local files (`mnist5k`,
  `digits`, `fashion_mnist_local`), `get_builder` (others must be prepared), `num_examples`.
- `arrays`, `fashion_mnist`: the offline datasets as numpy arrays, in TFDS's record order.
- `pp`, `pp_base`, `jax_pp`: the pp mini-language, its tf.data ops (incl. RandAugment) and
  its JAX ops.
- `input_pipeline`, `memory_pipeline`, `batching`: resumable training batches, padded eval
  batches, `make_global_batch`.
- `holdout`: a stratified validation split; `mixup`: mixup inside the jitted step.
"""
