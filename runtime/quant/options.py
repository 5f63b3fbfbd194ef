"""The values of the `quantization` option (EngineConfig, `--quantization`), importable without torch.

    auto       as the checkpoint is: GPTQ / AWQ / FP8 checkpoints load quantized, anything else (a GGUF file
               too) dense
    gguf       a GGUF file's weights stay quantized on CUDA: Q4_0 / Q4_1 / Q4_K repacked exactly into the int4
               kernels' layout, Q8_0 / Q5_K / Q6_K into their 8-bit form (dequantized at load on the CPU; other
               types, Q5_0 / Q5_1, dequantized at load everywhere)
    none       dense: a quantized checkpoint is dequantized at load
    int4       round-to-nearest int4, group 128 (`int4-g32`, `int4-g64` for smaller groups), of a dense model
    fp8        FP8 e4m3, per-output-channel scales, of a dense model
    gguf-q8_0 | gguf-q4_k | gguf-q5_k | gguf-q6_k   GGUF blocks (round-to-nearest) of a dense model, for
               benchmarks
"""

from __future__ import annotations

QUANTIZATION_CHOICES = ("auto", "none", "gguf", "int4", "int4-g32", "int4-g64", "fp8", "gguf-q8_0", "gguf-q4_k",
                        "gguf-q5_k", "gguf-q6_k")


def check_quantization(quantization: str) -> None:
    if quantization not in QUANTIZATION_CHOICES:
        raise ValueError(f"quantization must be one of {'|'.join(QUANTIZATION_CHOICES)}, got {quantization!r}")
