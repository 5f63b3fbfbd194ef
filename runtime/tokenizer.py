"""`radixgen.runtime.tokenizer`: the old name of `radixgen.tokenizer`, kept as an alias for one release."""

from radixgen.tokenizer import SPLIT_PATTERNS, AddedToken, IncrementalDetokenizer, Tokenizer, TokenizerSpec

__all__ = ["SPLIT_PATTERNS", "AddedToken", "IncrementalDetokenizer", "Tokenizer", "TokenizerSpec"]
