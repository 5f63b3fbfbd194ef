"""Errors a person can act on: each message is one line naming the file or value and what is wrong.

The CLI prints `str(error)` for these (no traceback unless --debug); anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations


class RadixgenError(Exception):
    """Base of the errors whose message alone tells the user what to do."""


class ModelLoadError(RadixgenError):
    """A model could not be loaded (base class; the subclasses say why)."""


class ModelNotFoundError(ModelLoadError):
    """The model path does not exist or holds nothing loadable."""


class UnsupportedArchitectureError(ModelLoadError):
    """The checkpoint's architecture is not one the Llama-family decoder implements."""


class CorruptModelFileError(ModelLoadError):
    """A weight file is truncated, malformed, or misses tensors the config requires."""


class UnsupportedQuantizationError(ModelLoadError):
    """A GGUF tensor uses a quantization type the loader does not dequantize."""


class TokenizerMismatchError(ModelLoadError):
    """The tokenizer has ids the model has no embedding row for (it belongs to another model)."""


class DownloadError(RadixgenError):
    """Fetching or verifying the default model failed."""
