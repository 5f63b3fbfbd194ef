"""Options of one engine (the `**options` of `radixgen.Engine` and the flags of `radixgen serve`)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class EngineConfig:
    model_path: str | None = None  # HF folder, .gguf file, or None for the default model
    tokenizer_path: str | None = None  # default: the model's own (folder's tokenizer.json or GGUF metadata)
    load_format: str = "auto"  # auto | safetensors | gguf | dummy
    dtype: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16 | float16
    # The layer linears: auto (as the checkpoint is) | none | int4 | fp8 | ... (runtime/quant/scheme.py)
    quantization: str = "auto"
    device: str = "auto"  # auto | cpu | cuda
    cpu_threads: int | None = None  # torch threads of a CPU engine (None: one per core; runtime/cpu_threads.py)
    context_length: int | None = None  # override the model's max_position_embeddings
    # Memory: either an explicit KV budget in tokens, or a fraction of free device memory (CUDA).
    max_total_tokens: int | None = None
    mem_fraction: float = 0.85
    # What the KV cache stores: auto (the model dtype) | fp8_e4m3 (e4m3 codes, per-head scales, twice the tokens;
    # "fp8" is an alias). See runtime/kv_pool.py.
    kv_cache_dtype: str = "auto"
    page_size: int = 1
    # Batching.
    max_running_requests: int = 256
    chunked_prefill_size: int = 2048  # max prefill tokens of one request per step (<= 0: no chunking)
    max_prefill_tokens: int = 8192  # prefill token budget of one step
    schedule_policy: str = "lpm"  # lpm (longest cached prefix first) | fcfs
    disable_radix_cache: bool = False
    # GPU path.
    cuda_graph: bool = True
    cuda_graph_max_bs: int = 256
    # Also capture graphs of rows of up to this many new tokens per request (jump-forward's forced tokens, at a
    # few total token counts per batch bucket; speculative verify rows of 2, 4, ... up to it); below 2: none
    # (such steps then run eagerly).
    cuda_graph_max_row_tokens: int = 8
    # Misc.
    random_seed: int = 0
    dummy_config: dict | None = None  # model config for load_format="dummy" without a model folder
    enable_jump_forward: bool = True
    grammar_backend: str = "radixgen"  # radixgen | xgrammar | llguidance (the last two through their extras)
    # Compiled grammars are kept under <cache dir>/grammars for later processes (also off: RADIXGEN_GRAMMAR_CACHE=0).
    disable_grammar_disk_cache: bool = False
    # Launch each decode step before delivering the previous step's tokens (host work overlaps the forward).
    disable_overlap_schedule: bool = False
    # Speculative decoding: drafts from n-gram lookup in the request's own tokens ("ngram"), a smaller model with
    # the same tokenizer ("draft_model", at draft_model_path), or only the text grammars force ("grammar"); every
    # algorithm also drafts a constrained request's forced text. Verify steps run while the batch has at most
    # speculative_max_batch decoding requests and the drafts pay for the step (runtime/speculative/policy.py).
    speculative_algorithm: str | None = None
    speculative_num_draft_tokens: int = 4
    speculative_ngram_min: int = 1
    speculative_ngram_max: int = 4
    speculative_max_batch: int = 16
    draft_model_path: str | None = None
    log_level: str = "warning"
    step_trace: int = 0  # keep the last this many steps' records (`EngineCore.step_trace`); 0: none

    @classmethod
    def from_options(cls, model_path: str | None = None, **options) -> EngineConfig:
        """Build from keyword options, refusing unknown names with the list of known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; known options: {sorted(known)}")
        cfg = cls(model_path=model_path, **options)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.schedule_policy not in ("lpm", "fcfs"):
            raise ValueError(f"schedule_policy must be 'lpm' or 'fcfs', got {self.schedule_policy!r}")
        from radixgen.runtime.quant.options import check_quantization

        check_quantization(self.quantization)
        if self.load_format not in ("auto", "safetensors", "gguf", "dummy"):
            raise ValueError(f"load_format must be auto|safetensors|gguf|dummy, got {self.load_format!r}")
        from radixgen.runtime.kv_pool import check_kv_cache_dtype

        check_kv_cache_dtype(self.kv_cache_dtype)
        if not 0.0 < self.mem_fraction <= 1.0:
            raise ValueError(f"mem_fraction must be in (0, 1], got {self.mem_fraction}")
        if self.step_trace < 0:
            raise ValueError(f"step_trace must be >= 0, got {self.step_trace}")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {self.cpu_threads}")
        if not isinstance(self.disable_grammar_disk_cache, bool):
            raise ValueError(f"disable_grammar_disk_cache must be a bool, got {self.disable_grammar_disk_cache!r}")
        if self.grammar_backend not in ("radixgen", "xgrammar", "llguidance"):
            raise ValueError(f"grammar_backend must be radixgen|xgrammar|llguidance, got {self.grammar_backend!r}")
        if self.speculative_algorithm not in (None, "ngram", "draft_model", "grammar"):
            raise ValueError("speculative_algorithm must be None|ngram|draft_model|grammar, "
                             f"got {self.speculative_algorithm!r}")
        if self.speculative_algorithm == "draft_model" and not self.draft_model_path:
            raise ValueError("speculative_algorithm='draft_model' needs draft_model_path (a model with the same "
                             "tokenizer)")
        if not 1 <= self.speculative_num_draft_tokens <= 16:
            raise ValueError(f"speculative_num_draft_tokens must be in [1, 16], got "
                             f"{self.speculative_num_draft_tokens}")
        if not 1 <= self.speculative_ngram_min <= self.speculative_ngram_max:
            raise ValueError("speculative n-gram sizes need 1 <= speculative_ngram_min <= speculative_ngram_max, got "
                             f"{self.speculative_ngram_min}..{self.speculative_ngram_max}")
        if self.speculative_max_batch < 1:
            raise ValueError(f"speculative_max_batch must be >= 1, got {self.speculative_max_batch}")
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
