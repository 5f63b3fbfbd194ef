"""radixgen: fast, exactly-shaped execution of multi-call LLM programs.

The public API is re-exported here; everything else is internal.
"""

__version__ = "0.1.0"
