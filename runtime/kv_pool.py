"""KV memory and its bookkeeping, kept as three separate things so that none knows the others' business:

    KVPool          the memory: per-layer K and V buffers [num_slots, num_kv_heads, head_dim]; a slot holds one
                    token's K/V of every layer. Slot 0 is never handed out: padded rows write there harmlessly.
                    In the model dtype, or (kv_cache_dtype="fp8_e4m3") FP8 codes with per (layer, KV head) scales.
    SlotAllocator   which slots are free (an int64 array used as a stack); knows nothing of tensors' contents.
    ReqToTokenPool  the int32 table [max_requests, max_context] mapping (request row, position) -> slot, plus
                    the free rows. Attention reads K/V through this table.

Reuse (which slots hold which prefix) is the radix tree's job, in radixgen.radix.
"""

from __future__ import annotations

import math
import mmap
import warnings

import numpy as np
import numpy.typing as npt
import torch

from radixgen.kernels.kv_quant import FP8_KV_DTYPE
from radixgen.kernels.quant_fp8 import FP8_MIN_CAPABILITY
from radixgen.runtime.config import ModelConfig

PADDING_SLOT = 0  # reserved slot: writes of padding rows land here and nothing reads it

# kv_cache_dtype names: "auto" is the model dtype; "fp8" is vLLM's alias of "fp8_e4m3" (e4m3fn codes)
KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8")


def check_kv_cache_dtype(name: str) -> None:
    """Refuse an unknown kv_cache_dtype, or FP8 with a torch that has no float8 dtypes."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be {'|'.join(KV_CACHE_DTYPES)}, got {name!r}")
    if name != "auto" and FP8_KV_DTYPE is None:
        raise ValueError(f"kv_cache_dtype={name!r} needs a torch with float8 dtypes (torch.float8_e4m3fn); "
                         f"torch {torch.__version__} has none: use kv_cache_dtype='auto'")


def kv_cache_dtype(name: str, model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype the KV pool stores: the model's for "auto", float8_e4m3fn for FP8 (on CUDA from compute
    capability 8.9, Ada/Hopper, whose conversions the kernels use)."""
    check_kv_cache_dtype(name)
    if name == "auto" or FP8_KV_DTYPE is None:
        return model_dtype
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < FP8_MIN_CAPABILITY:
        major, minor = torch.cuda.get_device_capability(device)
        raise ValueError(f"kv_cache_dtype={name!r} needs a GPU of compute capability >= 8.9 (Ada, Hopper or "
                         f"newer); {device} has {major}.{minor}: use kv_cache_dtype='auto'")
    return FP8_KV_DTYPE


class KVPool:
    """Preallocated K and V buffers for every layer, indexed by slot. An FP8 pool also holds the scales of its
    codes, `k_scales` and `v_scales` [num_layers, num_kv_heads] fp32 (x is stored as x / scale): 1.0 until
    `set_scales` puts calibrated ones, as vLLM and SGLang default to without a checkpoint's k_scale/v_scale."""

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        if num_slots < 2:
            raise ValueError(f"a KV pool needs at least 2 slots (slot 0 is reserved), got {num_slots}")
        self.num_slots = num_slots
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_slots, num_kv_heads, head_dim)
        self.k_buffers = [lazy_zeros(shape, dtype, self.device) for _ in range(num_layers)]
        self.v_buffers = [lazy_zeros(shape, dtype, self.device) for _ in range(num_layers)]
        self.k_scales: torch.Tensor | None = None
        self.v_scales: torch.Tensor | None = None
        if FP8_KV_DTYPE is not None and dtype == FP8_KV_DTYPE:
            self.k_scales = torch.ones(num_layers, num_kv_heads, dtype=torch.float32, device=self.device)
            self.v_scales = torch.ones(num_layers, num_kv_heads, dtype=torch.float32, device=self.device)

    def scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Layer `layer`'s (k_scale, v_scale) [num_kv_heads] of an FP8 pool (views: a captured graph reads what
        `set_scales` writes later), None for a pool holding K/V as they are."""
        if self.k_scales is None or self.v_scales is None:
            return None
        return self.k_scales[layer], self.v_scales[layer]

    def set_scales(self, k_scales: torch.Tensor | float, v_scales: torch.Tensor | float) -> None:
        """Calibrated scales of an FP8 pool, broadcast to [num_layers, num_kv_heads] (a per-tensor value per layer
        as [num_layers, 1]). Set them before the pool holds any token: codes already stored keep their old scale."""
        if self.k_scales is None or self.v_scales is None:
            raise ValueError(f"a KV pool of {self.dtype} takes no scales (only kv_cache_dtype='fp8_e4m3' does)")
        for dst, src in ((self.k_scales, k_scales), (self.v_scales, v_scales)):
            t = torch.as_tensor(src, dtype=torch.float32).to(self.device).expand_as(dst)
            if not bool(torch.isfinite(t).all()) or not bool((t > 0).all()):
                raise ValueError("KV cache scales must be finite and positive")
            dst.copy_(t)

    @classmethod
    def for_model(cls, config: ModelConfig, num_slots: int, dtype: torch.dtype,
                  device: torch.device | str) -> KVPool:
        """A pool for `config`'s layers holding K/V in `dtype` (`kv_cache_dtype`'s result)."""
        return cls(config.num_hidden_layers, num_slots, config.num_key_value_heads, config.head_dim, dtype, device)

    @property
    def num_usable_slots(self) -> int:
        """Slots that can hold tokens (all but the reserved padding slot)."""
        return self.num_slots - 1

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.k_buffers + self.v_buffers)


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A zero tensor. On the CPU it lives in an anonymous memory map: the OS hands out zero pages as they are
    first written, so a large buffer costs memory only for the parts in use (torch.zeros would touch every page).
    The map is unmapped when the last tensor viewing it goes."""
    device = torch.device(device)
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    count = math.prod(shape)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    with warnings.catch_warnings():  # the map is writable; torch warns about buffers in general
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(mmap.mmap(-1, max(nbytes, 1)), dtype=dtype, count=count).view(shape)


CPU_KV_BUDGET_BYTES = 1 << 30  # the CPU pool's default size (memory there is shared with everything else)


def kv_pool_num_slots(config: ModelConfig, dtype: torch.dtype, device: torch.device, max_total_tokens: int | None,
                      mem_fraction: float, cpu_budget_bytes: int = CPU_KV_BUDGET_BYTES,
                      companion: tuple[int, int] = (0, 0)) -> int:
    """How many slots (tokens + the padding slot) the pool gets.

    An explicit `max_total_tokens` wins. On CUDA the pool takes `mem_fraction` of the memory still free after the
    weights are loaded; on the CPU, where memory is shared with everything else, a fixed budget
    (`cpu_budget_bytes`, 1 GiB) that still holds at least one full context. Bytes per token count `dtype`, the
    cache's: an FP8 cache holds twice a 16-bit one's tokens (its scales are per layer, not per token).
    `companion` = (bytes per token, bytes up front) of a model loaded later that needs a slot for each of this
    pool's (a draft model): on CUDA both come out of this pool's share, so the later model still fits.
    """
    if max_total_tokens is not None:
        if max_total_tokens < 1:
            raise ValueError(f"max_total_tokens must be >= 1, got {max_total_tokens}")
        return max_total_tokens + 1
    per_token = config.kv_bytes_per_token(torch.empty((), dtype=dtype).element_size())
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        companion_per_token, companion_bytes = companion
        tokens = (int(free * mem_fraction) - companion_bytes) // (per_token + companion_per_token)
        if tokens < 1:
            raise MemoryError(f"no CUDA memory left for the KV cache ({free / 2**30:.2f} GiB free)")
        return tokens + 1
    return max(cpu_budget_bytes // per_token, config.max_position_embeddings) + 1


class SlotAllocator:
    """Free KV slots as a stack in an int64 array. alloc/free are O(n) array slices, no per-slot Python objects."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        # Slot 0 is reserved; hand out low slots first (pop from the end of the reversed range).
        self._free = np.arange(num_slots - 1, 0, -1, dtype=np.int64)
        self._num_free = num_slots - 1

    @property
    def num_free(self) -> int:
        return self._num_free

    def alloc(self, n: int) -> npt.NDArray[np.int64] | None:
        """n free slot indices (int64), or None when fewer than n are free (nothing is taken then)."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} slots")
        if n > self._num_free:
            return None
        self._num_free -= n
        return self._free[self._num_free : self._num_free + n][::-1].copy()

    def free(self, slots: np.ndarray | torch.Tensor) -> None:
        """Return slots to the free stack. Freeing the reserved slot or more slots than exist is a bug."""
        arr = slots.detach().cpu().numpy() if isinstance(slots, torch.Tensor) else np.asarray(slots)
        arr = arr.astype(np.int64, copy=False).reshape(-1)
        if arr.size == 0:
            return
        if self._num_free + arr.size > self.num_slots - 1 or int(arr.min()) <= PADDING_SLOT \
                or int(arr.max()) >= self.num_slots:
            raise ValueError(f"invalid free of {arr.size} slots (free={self._num_free}, range 1..{self.num_slots - 1})")
        self._free[self._num_free : self._num_free + arr.size] = arr[::-1]
        self._num_free += arr.size

    def reset(self) -> None:
        self._free = np.arange(self.num_slots - 1, 0, -1, dtype=np.int64)
        self._num_free = self.num_slots - 1


class ReqToTokenPool:
    """The table [max_requests, max_context] (int32) of slot indices, and which of its rows are free."""

    def __init__(self, max_requests: int, max_context: int, device: torch.device | str) -> None:
        self.max_requests = max_requests
        self.max_context = max_context
        # Zero pages on demand: a row costs memory once a request writes its positions.
        self.req_to_token = lazy_zeros((max_requests, max_context), torch.int32, device)
        self._free_rows = list(range(max_requests - 1, -1, -1))
        # How many times each row was handed out: (row, allocations[row]) names one holder, so state kept per row
        # (runtime/attention/decode_kv_copies.py) is never read for the next request that gets the row.
        self.allocations = np.zeros(max_requests, dtype=np.int64)

    @property
    def num_free(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        """A free row index, or None when every row is taken."""
        if not self._free_rows:
            return None
        row = self._free_rows.pop()
        self.allocations[row] += 1
        return row

    def rehold(self, row: int) -> None:
        """A taken row now holds another sequence (a beam turned into another's fork): a new holder, as if freed
        and handed out again."""
        self.allocations[row] += 1

    def free(self, row: int) -> None:
        if not 0 <= row < self.max_requests or row in self._free_rows:
            raise ValueError(f"invalid free of request row {row}")
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: np.ndarray | torch.Tensor) -> None:
        """req_to_token[row, start : start + len(slots)] = slots."""
        t = torch.as_tensor(slots).to(device=self.req_to_token.device, dtype=torch.int32)
        if start + t.numel() > self.max_context:
            raise ValueError(f"positions {start}..{start + t.numel() - 1} exceed max_context {self.max_context}")
        self.req_to_token[row, start : start + t.numel()] = t
