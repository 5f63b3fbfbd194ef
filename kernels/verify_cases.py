"""The check table for radixgen.kernels.verify: which shapes each kernel is checked at.

"small" cases run in seconds under TRITON_INTERPRET=1 on a CPU; "real" cases are the sizes a GPU serves
(Llama-3-8B-shaped heads, SmolLM2's 9 q / 3 kv heads, batch 256 x 2k, 1 x 32k). Every case names an op of
radixgen.kernels, a shape description and an element dtype; verify.RUNNERS turns it into random inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    """One check: an op, a shape description, and the element dtype."""

    op: str
    name: str
    dtype: str
    params: dict = field(default_factory=dict, hash=False)

    @property
    def id(self) -> str:
        return f"{self.op}-{self.name}-{self.dtype}"


def _attention_cases(size: str) -> list[Case]:
    if size == "small":
        # fp16: Triton 3.9's interpreter multiplies bf16 dot operands wrongly (their raw bits); bf16 attention
        # is covered on the GPU
        dt = "float16"
        return [
            Case("extend_attention", "ragged-gqa1-d64", dt, {"prefix": [0, 5, 9, 17], "extend": [7, 1, 0, 33],
                                                                 "heads": (2, 2), "head_dim": 64}),
            Case("extend_attention", "smollm2-9q3kv-d64", dt, {"prefix": [3, 40], "extend": [21, 70],
                                                                   "heads": (9, 3), "head_dim": 64}),
            Case("extend_attention", "gqa4-d128", dt, {"prefix": [0, 130], "extend": [65, 9], "heads": (4, 1),
                                                           "head_dim": 128}),
            Case("extend_attention", "window16-gqa4", dt, {"prefix": [10, 0], "extend": [150, 37], "heads": (4, 1),
                                                               "head_dim": 64, "window": 16}),
            Case("extend_attention", "gqa3-d64", "float32", {"prefix": [9], "extend": [29], "heads": (3, 1),
                                                                 "head_dim": 64}),
            Case("decode_attention", "ragged-gqa1-d64", dt, {"seq_lens": [1, 17, 64, 200], "heads": (2, 2),
                                                                 "head_dim": 64}),
            Case("decode_attention", "smollm2-9q3kv-splits3", dt, {"seq_lens": [33, 5, 129], "heads": (9, 3),
                                                                       "head_dim": 64, "splits": 3}),
            Case("decode_attention", "gqa4-d128-splits8", dt, {"seq_lens": [300, 7], "heads": (8, 2), "head_dim": 128,
                                                                   "splits": 8}),
            Case("decode_attention", "window32-gqa4-splits3", dt, {"seq_lens": [100, 20, 33], "heads": (4, 1),
                                                                       "head_dim": 64, "window": 32, "splits": 3}),
            Case("decode_attention", "gqa3-d64", "float32", {"seq_lens": [77, 2], "heads": (3, 1), "head_dim": 64}),
            *_multi_query_cases(size),
        ]
    dt = "bfloat16"
    return [
        Case("extend_attention", "llama8b-ragged", dt, {"prefix": [0, 1000, 3000, 17], "extend": [2048, 513, 77, 1],
                                                            "heads": (32, 8), "head_dim": 128}),
        Case("extend_attention", "smollm2-9q3kv", dt, {"prefix": [0, 700], "extend": [1500, 301], "heads": (9, 3),
                                                           "head_dim": 64}),
        Case("extend_attention", "mha-d128", "float16", {"prefix": [64, 0], "extend": [300, 999], "heads": (8, 8),
                                                             "head_dim": 128}),
        Case("extend_attention", "window512-gqa4", dt, {"prefix": [1500, 0], "extend": [700, 1999], "heads": (32, 8),
                                                            "head_dim": 128, "window": 512}),
        Case("decode_attention", "b1-32k", dt, {"seq_lens": [32768], "heads": (32, 8), "head_dim": 128}),
        Case("decode_attention", "b64-ragged", dt, {"seq_lens": [(37 * i * i + 11) % 4000 + 1 for i in range(64)],
                                                        "heads": (32, 8), "head_dim": 128}),
        Case("decode_attention", "b256-2k", dt, {"seq_lens": [2048] * 255 + [3], "heads": (32, 8), "head_dim": 128}),
        Case("decode_attention", "smollm2-9q3kv", dt, {"seq_lens": [5000, 1, 333], "heads": (9, 3), "head_dim": 64}),
        Case("decode_attention", "gqa3-d128", "float16", {"seq_lens": [1025, 2049], "heads": (24, 8),
                                                              "head_dim": 128}),
        Case("decode_attention", "window4096", dt, {"seq_lens": [9000, 100, 5000], "heads": (32, 8), "head_dim": 128,
                                                        "window": 4096}),
        *_multi_query_cases(size),
    ]


def _multi_query_cases(size: str) -> list[Case]:
    """Rows of 1..8 new tokens after ragged prefixes (0 and lengths off the 64-key block included), GQA 1/3/4,
    forced split counts (more splits than blocks too), windows, FP8 codes, and a CUDA graph's padding: rows of 0
    tokens and flat rows no request owns (`pad_tokens`)."""
    op = "multi_query_decode_attention"
    if size == "small":
        dt = "float16"
        return [
            Case(op, "ragged-gqa1-d64", dt, {"prefix": [0, 5, 63, 130], "extend": [3, 8, 1, 2], "heads": (2, 2),
                                             "head_dim": 64}),
            Case(op, "gqa4-d64-splits3", dt, {"prefix": [40, 200, 7], "extend": [4, 7, 2], "heads": (8, 2),
                                              "head_dim": 64, "splits": 3}),
            Case(op, "window16-gqa4-splits4", dt, {"prefix": [100, 10, 33], "extend": [5, 8, 1], "heads": (4, 1),
                                                   "head_dim": 64, "window": 16, "splits": 4}),
            Case(op, "graph-padding-gqa4-splits2", dt, {"prefix": [70, 0, 0, 9], "extend": [8, 0, 0, 2],
                                                        "heads": (4, 1), "head_dim": 64, "splits": 2,
                                                        "pad_tokens": 6}),
            Case(op, "fp8-gqa4-splits3", dt, {"prefix": [50, 3], "extend": [6, 2], "heads": (8, 2), "head_dim": 64,
                                              "splits": 3, "fp8": True}),
            Case(op, "fp8-window8-gqa1", dt, {"prefix": [30, 12], "extend": [3, 4], "heads": (2, 2), "head_dim": 64,
                                              "window": 8, "splits": 2, "fp8": True}),
            Case(op, "gqa3-d64", "float32", {"prefix": [77, 0], "extend": [5, 4], "heads": (3, 1), "head_dim": 64}),
            Case(op, "gqa4-d128-splits8", dt, {"prefix": [130, 1], "extend": [8, 1], "heads": (4, 1),
                                               "head_dim": 128, "splits": 8}),
            # 32 tokens x 8 heads overflow one query tile: the extend kernel serves the launch
            Case(op, "tile-overflow-gqa8", dt, {"prefix": [10, 30], "extend": [20, 3], "heads": (8, 1),
                                                "head_dim": 64}),
        ]
    dt = "bfloat16"
    llama = {"heads": (32, 8), "head_dim": 128}
    return [
        Case(op, "llama8b-b1-k4", dt, {"prefix": [1500], "extend": [4], **llama}),
        Case(op, "llama8b-b32-ragged-k8", dt, {"prefix": [(397 * i) % 4000 for i in range(32)],
                                               "extend": [1 + (3 * i) % 8 for i in range(32)], **llama}),
        Case(op, "llama8b-b256-k4", dt, {"prefix": [2044] * 255 + [0], "extend": [4] * 255 + [3], **llama}),
        Case(op, "llama8b-graph-padding-splits32", dt, {"prefix": [1023, 4095, 0, 0], "extend": [8, 3, 0, 0],
                                                        "pad_tokens": 13, "splits": 32, **llama}),
        Case(op, "llama8b-window512", dt, {"prefix": [1500, 0, 700], "extend": [8, 5, 2], "window": 512, **llama}),
        Case(op, "llama8b-fp8", dt, {"prefix": [4095, 1000, 17], "extend": [4, 8, 1], "fp8": True, **llama}),
        Case(op, "smollm2-9q3kv", "float16", {"prefix": [5000, 1, 333], "extend": [8, 2, 5], "heads": (9, 3),
                                              "head_dim": 64}),
    ]


def _elementwise_cases(size: str) -> list[Case]:
    small = size == "small"
    rows = 5 if small else 1031
    hidden = [96, 576] if small else [576, 4096]
    cases: list[Case] = []
    for h in hidden:
        for dt in ("bfloat16", "float32"):
            cases.append(Case("rmsnorm", f"{rows}x{h}", dt, {"shape": (rows, h)}))
            cases.append(Case("fused_add_rmsnorm", f"{rows}x{h}", dt, {"shape": (rows, h)}))
    inter = 100 if small else 14336
    cases += [
        Case("silu_and_mul", f"{rows}x{inter}", "bfloat16", {"shape": (rows, 2 * inter)}),
        Case("silu_and_mul", "3x4x64", "float16", {"shape": (3, 4, 128)}),
        Case("store_kv", "strided", "bfloat16", {"slots": 60 if small else 100_000, "tokens": 7 if small else 4096,
                                                     "kv_heads": 3 if small else 8, "head_dim": 64 if small else 128}),
        Case("store_kv", "fp32", "float32", {"slots": 40, "tokens": 9, "kv_heads": 2, "head_dim": 128}),
    ]
    tokens = 7 if small else 2048
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    cases += [
        Case("apply_rotary", "smollm2-neox", "bfloat16", {"tokens": tokens, "heads": (9, 3), "head_dim": 64,
                                                              "neox": True, "max_pos": 100}),
        Case("apply_rotary", "interleaved", "float32", {"tokens": tokens, "heads": (4, 2), "head_dim": 128,
                                                            "neox": False, "max_pos": 50}),
        Case("apply_rotary", "llama3-scaled", "bfloat16", {"tokens": tokens, "heads": (32, 8), "head_dim": 128,
                                                               "neox": True, "max_pos": 20000, "base": 500000.0,
                                                               "scaling": llama3}),
        Case("apply_rotary", "partial-32of64", "float16", {"tokens": tokens, "heads": (4, 4), "head_dim": 64,
                                                               "rotary_dim": 32, "neox": True, "max_pos": 64}),
        Case("apply_rotary", "partial-interleaved", "float32", {"tokens": tokens, "heads": (3, 1), "head_dim": 64,
                                                                    "rotary_dim": 48, "neox": False, "max_pos": 64}),
    ]
    vocab = 1000 if small else 128_256
    words = (vocab + 31) // 32
    cases += [
        Case("apply_token_bitmask", f"all-rows-{vocab}", "float32", {"rows": 6, "vocab": vocab, "words": words}),
        Case("apply_token_bitmask", "row-indices", "bfloat16", {"rows": 8 if small else 256, "vocab": vocab,
                                                                   "words": words, "masked_rows": 3 if small else 100}),
        Case("apply_token_bitmask", "staged-rows", "bfloat16", {"rows": 8 if small else 256, "vocab": vocab,
                                                                   "words": words, "masked_rows": 3 if small else 100,
                                                                   "staged": True}),
        Case("apply_token_bitmask", "mask-shorter-than-vocab", "float32", {"rows": 2, "vocab": vocab + 77,
                                                                               "words": words}),
    ]
    return cases


def cases(size: str = "small") -> list[Case]:
    """The check table: "small" shapes for the CPU interpreter, "real" shapes for the GPU."""
    return _attention_cases(size) + _elementwise_cases(size)
