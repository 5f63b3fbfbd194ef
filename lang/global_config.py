"""`sgl.global_config`: SGLang's object of frontend settings, so programs that set its fields run unchanged.

Only `default_backend` has an effect: it reads and writes the backend `set_default_backend` sets (one place
holds it). The other fields are SGLang's, accepted and kept so that code reading or setting them works, with
no effect here: radixgen always prefills a fork's shared prefix (`enable_precache_with_tracing`,
`enable_parallel_encoding`), never prints runs (`verbosity`), and takes decode options per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixgen.lang.backend import Backend
from radixgen.lang.function import get_default_backend, set_default_backend


@dataclass
class GlobalConfig:
    """SGLang's `GlobalConfig` fields with its defaults; see the module docstring for which ones act."""

    verbosity: int = 0
    enable_precache_with_tracing: bool = True
    enable_parallel_encoding: bool = True
    skip_special_tokens_in_output: bool = True
    spaces_between_special_tokens_in_out: bool = True
    default_init_new_token_ratio: float = 0.7
    default_min_new_token_ratio_factor: float = 0.14
    default_new_token_ratio_decay_steps: float = 600
    torch_empty_cache_interval: float = -1
    retract_decode_steps: int = 20
    flashinfer_workspace_size: int = 384 * 1024 * 1024

    @property
    def default_backend(self) -> Backend | None:
        return get_default_backend()

    @default_backend.setter
    def default_backend(self, backend: Any) -> None:
        set_default_backend(backend)


global_config = GlobalConfig()
