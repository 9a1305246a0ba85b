"""What did the attention learn? Load a run, look at its attention maps and statistics.

    from big_vision_relu import inspect
    run = inspect.load_run("workdirs/mnist_relu")             # newest checkpoint (or step=...)
    images, labels = inspect.eval_examples(run, 16)           # the run's own eval data and pp
    out = inspect.run_model(run, images)                      # logits, weights, q, k, residual
    out.weights[layer]                                        # [n, heads, q_len, k_len]
    inspect.attention_statistics(out.weights, out.grid_shape, out.num_prefix_tokens)
    inspect.qk_logit_norms(out.queries, out.keys)
    inspect.attention_shares(out.attention_outputs, out.block_inputs)  # |attention| / |input|
    inspect.layer_table(out)                                  # the three above, one row a layer

`load_npz(path, model_config)` does the same for a big_vision `.npz`. This package is the
notebook front end, split by job: `loading` (runs: checkpoint, config, metrics), `images`
(eval data, photos), `inspection` (the model over images, the per-layer table). The forward
pass that captures the attention (`evaluators.attention_capture`) and the statistics
(`evaluators.attention_statistics`, whose docstring defines them) are shared with the
`attention_stats` evaluator and re-exported here.
"""
from big_vision_relu.evaluators.attention_capture import apply_inspecting, token_layout
from big_vision_relu.evaluators.attention_statistics import (
    STAT_NAMES, TokenLayout, attention_shares, attention_statistics, infer_layout,
    patch_distances, qk_logit_norms, received_attention, row_statistics)
from big_vision_relu.inspect.images import eval_examples, input_shape, photo_batch, sample_photos
from big_vision_relu.inspect.inspection import Inspection, attention_maps, layer_table, run_model
from big_vision_relu.inspect.loading import (Run, checkpoint_steps, data_dir, load_npz, load_run,
                                            read_metrics)

__all__ = [
    # loading
    "Run", "checkpoint_steps", "data_dir", "load_npz", "load_run", "read_metrics",
    # images
    "eval_examples", "input_shape", "photo_batch", "sample_photos",
    # the model over images
    "Inspection", "attention_maps", "layer_table", "run_model",
    # evaluators.attention_capture
    "apply_inspecting", "token_layout",
    # evaluators.attention_statistics
    "STAT_NAMES", "TokenLayout", "attention_shares", "attention_statistics", "infer_layout",
    "patch_distances", "qk_logit_norms", "received_attention", "row_statistics",
]
