"""The optional peer grammar backends (XGrammar, llguidance) behind grammars/backend.py's protocols; each module
imports its package, so only `grammar_backend_factory` imports them, when asked for that backend."""
