"""radixgen.tokenizer: our own BPE tokenizer (byte-level and SentencePiece-style), byte-identical to
Hugging Face's, with streaming detokenization and chat templates.

    tok = Tokenizer.from_file("tokenizer.json" | "model.gguf" | "r50k_base.tiktoken", pattern=...)
    ids = tok.encode("Hello"); text = tok.decode(ids); tok.all_token_bytes(); tok.apply_chat_template(messages)
"""

from .added_tokens import AddedToken
from .detokenizer import IncrementalDetokenizer
from .patterns import SPLIT_PATTERNS
from .spec import TokenizerSpec
from .tokenizer import Tokenizer

__all__ = ["SPLIT_PATTERNS", "AddedToken", "IncrementalDetokenizer", "Tokenizer", "TokenizerSpec"]
