"""big_vision_relu: ViTs with pointwise (ReLU / sequence-length) attention, big_vision style."""
import os as _os

# TensorFlow (tf.data, TFDS) prints pages of start-up noise; quiet it unless the user chose.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
_os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

__version__ = "0.1.0"
