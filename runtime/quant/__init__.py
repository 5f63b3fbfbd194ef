"""Quantized weights at load: quantizing dense checkpoints, reading GPTQ/AWQ/FP8 checkpoints and GGUF blocks.

The packed formats and their matmuls live in radixgen.kernels (`quant_weight`, `quant_ref` and the Triton and
FP8 kernels); this package turns what a checkpoint holds into them and puts them in the model's linear slots.
"""
