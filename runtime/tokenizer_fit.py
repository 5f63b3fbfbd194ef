"""Whether a tokenizer fits a model: every id it can produce needs a row of the model's embedding.

A model may have more rows than its tokenizer has ids (Qwen2 pads 151,665 tokens to 151,936 rows); the sampler
never draws those padding ids. Fewer rows mean the tokenizer belongs to another model, so the engine refuses
it at start. Random-weight models (`load_format="dummy"`, for benchmarks of shapes) may borrow any tokenizer.
"""

from __future__ import annotations

from radixgen.runtime.errors import TokenizerMismatchError


def check_tokenizer_fits(model_vocab_size: int, tokenizer_vocab_size: int, load_format: str) -> None:
    """Raise TokenizerMismatchError when the tokenizer has more ids than the model's vocabulary has rows."""
    if tokenizer_vocab_size <= model_vocab_size or load_format == "dummy":
        return
    raise TokenizerMismatchError(
        f"the tokenizer has {tokenizer_vocab_size:,} ids but the model's vocabulary has {model_vocab_size:,} "
        f"(config vocab_size): it belongs to another model; use the model's own tokenizer (--tokenizer-path)")
