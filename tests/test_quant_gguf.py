"""GGUF kept quantized (`quantization="gguf"` on CUDA) runs like the dequantized model; its blocks repacked as
Int4Weights (Q4_0, Q4_1, Q4_K) and Int8Weights (Q8_0, Q5_K, Q6_K) dequantize to the reference's values bit for bit;
the block decoders and quantizers agree with gguf.quants; dense models quantized at load (`quantization=...`)
track the dense model."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from interpreted import run_interpreted
from quant_fixtures import prefill_logits

from radixgen.kernels import (
    BLOCK_FORMATS,
    GGUFWeight,
    Int4Weight,
    Int8Weight,
    LinearWeight,
    StackedWeight,
    dequantize_weight,
)
from radixgen.kernels.gguf_ref import Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0, BlockFormat, dequantize_blocks
from radixgen.runtime.config import ModelConfig
from radixgen.runtime.loader import _load_gguf, load_model
from radixgen.runtime.loader.gguf_file import hf_name, load_gguf_weights, open_gguf, read_gguf_config
from radixgen.runtime.loader.weight_sink import WeightSink
from radixgen.runtime.models.llama import LlamaForCausalLM
from radixgen.runtime.quant.gguf_blocks import QUANTIZABLE_TYPES, quantize_blocks
from radixgen.runtime.quant.gguf_linears import GGUFLinearBlocks
from radixgen.runtime.quant.gguf_repack import REPACKED_TYPES, repack_blocks

PROMPT = [1, 17, 2000, 33, 5, 99, 250, 4000, 12, 7]
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4096, "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def _packed_kinds(model: LlamaForCausalLM) -> set[str]:
    def kind(w: LinearWeight) -> str:
        if isinstance(w, StackedWeight):
            return "+".join(kind(p) for p in w.parts)
        if isinstance(w, GGUFWeight):
            return BLOCK_FORMATS[w.qtype].name
        return type(w).__name__
    return {kind(slot.weight) for slot in model.linear_slots()}


def _layout(w: LinearWeight) -> str:
    """A weight's layout by name: GGUF type, int4 with zero points or minimums and its scales' dtype, int8 with
    its group and scales' dtype, parts."""
    if isinstance(w, StackedWeight):
        return "+".join(_layout(p) for p in w.parts)
    if isinstance(w, GGUFWeight):
        return BLOCK_FORMATS[w.qtype].name
    if isinstance(w, Int4Weight):
        return f"int4-{'zeros' if w.mins is None else 'mins'}-{str(w.scales.dtype).removeprefix('torch.')}"
    if isinstance(w, Int8Weight):
        mins = "" if w.mins is None else "-mins"
        return f"int8-g{w.group_size}{mins}-{str(w.scales.dtype).removeprefix('torch.')}"
    return "dense"


def _layouts(model: LlamaForCausalLM) -> set[str]:
    return {_layout(slot.weight) for slot in model.linear_slots()}


def _load_kept_quantized(path: Path, repack: bool) -> tuple[LlamaForCausalLM, ModelConfig]:
    """The CUDA load of `quantization="gguf"` (`_load_gguf(keep_blocks=True)`) on the CPU; without `repack`,
    the same steps with every shard kept a GGUFWeight."""
    gguf_file = open_gguf(path)
    config = read_gguf_config(gguf_file, path)
    model = LlamaForCausalLM(config, dense_linears=False)
    if repack:
        _load_gguf(model, gguf_file, config, path, torch.device("cpu"), None, keep_blocks=True)
        return model.eval(), config
    names = {n: t.tensor_type.value for t in gguf_file.tensors if (n := hf_name(t.name)) is not None}
    blocks = GGUFLinearBlocks(model, names, str(path), repack=repack)
    sink = WeightSink(model, str(path), exclude=blocks.names)
    load_gguf_weights(sink, gguf_file, config, path, torch.device("cpu"), blocks)
    sink.finish()
    blocks.finish()
    return model.eval(), config


@pytest.mark.parametrize("qtype", sorted(BLOCK_FORMATS))
def test_block_decoder_is_bit_identical_to_gguf(qtype: int) -> None:
    gguf = pytest.importorskip("gguf")
    w = torch.from_numpy(np.random.default_rng(0).standard_normal((16, 512)).astype(np.float32)) * 0.05
    if qtype in QUANTIZABLE_TYPES:
        blocks = quantize_blocks(w, qtype)
    else:
        raw = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType(qtype))
        blocks = torch.from_numpy(np.ascontiguousarray(raw)).reshape(16, -1)
    want = np.asarray(gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType(qtype)), dtype=np.float32)
    got = dequantize_blocks(blocks, qtype)
    assert torch.equal(got, torch.from_numpy(want).reshape(16, 512))
    assert _rel(got, w) < 0.1  # a round-to-nearest quantization of w


@pytest.mark.parametrize("repack", [True, False])
def test_default_gguf_kept_quantized_matches_dequantize_at_load(default_model_path, repack: bool) -> None:
    """The CUDA layout, run through the reference on the CPU: the same logits as the dense load. The default
    model's linears are all Q4_1: repacked, every slot is one Int4Weight with fp16 scales and minimums."""
    packed, config = _load_kept_quantized(default_model_path, repack)
    dense, _ = load_model(default_model_path)
    assert _layouts(packed) == ({"int4-mins-float16"} if repack else {"Q4_1"})
    torch.testing.assert_close(prefill_logits(packed.eval(), config, PROMPT), prefill_logits(dense, config, PROMPT),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("quantization", "kind", "bound"),
                         [("int4", "Int4Weight", 0.3), ("int4-g32", "Int4Weight", 0.25), ("fp8", "Fp8Weight", 0.1),
                          ("gguf-q8_0", "Q8_0", 0.02), ("gguf-q4_k", "Q4_K", 0.25), ("gguf-q5_k", "Q5_K", 0.1),
                          ("gguf-q6_k", "Q6_K", 0.06)])
def test_dense_model_quantized_at_load_tracks_it(quantization: str, kind: str, bound: float) -> None:
    """Random Gaussian weights are the worst case for 4 bits (no outliers to spend the range on, nothing
    redundant): bounds are about 1.5x what each scheme gives here, in their expected order."""
    dense, config = load_model(None, "dummy", dummy_config=TINY, seed=3)
    quant, _ = load_model(None, "dummy", dummy_config=TINY, seed=3, quantization=quantization)
    assert _packed_kinds(quant) == {kind}
    assert _rel(prefill_logits(quant, config, PROMPT), prefill_logits(dense, config, PROMPT)) < bound


def test_int4_falls_back_to_a_group_that_divides_the_inputs() -> None:
    cfg = {**TINY, "hidden_size": 192, "intermediate_size": 320}  # 192 = 3 x 64, 320 = 5 x 64
    model, _ = load_model(None, "dummy", dummy_config=cfg, quantization="int4")
    groups = {slot.weight.group_size for slot in model.linear_slots() if isinstance(slot.weight, Int4Weight)}
    assert groups == {64}


def test_engine_option_quantization_is_validated() -> None:
    from radixgen.runtime.engine_config import EngineConfig

    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineConfig.from_options(quantization="int3")


@pytest.mark.gpu
def test_default_gguf_on_cuda_keeps_blocks_and_tracks_the_cpu_model(default_model_path) -> None:
    from test_quant_checkpoints import _cuda_logits

    model, config = load_model(default_model_path, device="cuda", dtype=torch.bfloat16, quantization="gguf")
    assert _layouts(model) == {"int4-mins-float16"}  # all Q4_1, repacked
    dense, _ = load_model(default_model_path)
    assert _rel(_cuda_logits(model, config), prefill_logits(dense, config, [1, 17, 2000, 33, 5, 99, 250, 4000, 12,
                                                                           7])) < 5e-2


# --- Q4_0 / Q4_1 / Q4_K repacked as Int4Weight, Q8_0 / Q5_K / Q6_K as Int8Weight --------------------------------

REPACKED = [Q4_0, Q4_1, Q4_K, Q8_0, Q5_K, Q6_K]
# bits per weight: the GGUF block, and the weight it becomes: 4-bit q + an fp16 (Q4_0, Q4_1) or fp32 (Q4_K) scale
# and offset per 32; 8-bit q + an fp16 scale per 32 (Q8_0), an fp32 scale and minimum per 32 (Q5_K) or an fp32
# scale per 16 (Q6_K)
BLOCK_BPW = {Q4_0.code: 4.5, Q4_1.code: 5.0, Q4_K.code: 4.5, Q8_0.code: 8.5, Q5_K.code: 5.5, Q6_K.code: 6.5625}
REPACKED_BPW = {Q4_0.code: 5.0, Q4_1.code: 5.0, Q4_K.code: 6.0, Q8_0.code: 8.5, Q5_K.code: 10.0, Q6_K.code: 10.0}
REPACKED_LAYOUT = {Q4_0.code: "int4-zeros-float16", Q4_1.code: "int4-mins-float16", Q4_K.code: "int4-mins-float32",
                   Q8_0.code: "int8-g32-float16", Q5_K.code: "int8-g32-mins-float32", Q6_K.code: "int8-g16-float32"}
EXTREME_HALVES = (65504.0, -65504.0, 2.0**-24, -(2.0**-24), 2.0**-14, 0.0, -0.0, 1.0, -1.0, 0.0999)
HALF_FIELDS = {Q4_0.code: (0,), Q4_1.code: (0, 2), Q4_K.code: (0, 2), Q8_0.code: (0,), Q5_K.code: (0, 2),
               Q6_K.code: (208,)}  # d (m)


def random_blocks(qtype: int, rows: int, k: int, gen: torch.Generator, extremes: bool = True) -> torch.Tensor:
    """uint8 [rows, row bytes] of random blocks: random quants (and Q4_K 6-bit, Q6_K 8-bit scales and mins) with
    finite f16 fields (d, and m or dmin) drawn over every finite bit pattern; with `extremes` the first rows take
    EXTREME_HALVES (largest, subnormal, signed zeros), one Q4_K / Q5_K super-block has every 6-bit field 63, one 0, and
    the first Q6_K super-blocks of the largest d's rows have every sub-block scale -128 and 127."""
    fmt = BLOCK_FORMATS[qtype]
    blocks = torch.randint(0, 256, (rows, k // fmt.block_elems, fmt.block_bytes), dtype=torch.uint8, generator=gen)
    offsets = HALF_FIELDS[qtype]
    bits = torch.randint(0, 0x7C00, (rows, blocks.shape[1], len(offsets)), generator=gen)  # finite magnitudes
    bits |= torch.randint(0, 2, bits.shape, generator=gen) << 15
    if extremes:
        table = torch.tensor(EXTREME_HALVES, dtype=torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF
        for r in range(min(rows, len(EXTREME_HALVES))):
            for j in range(len(offsets)):
                bits[r, :, j] = table[(r + 3 * j) % len(table)]
    for j, at in enumerate(offsets):
        blocks[..., at] = (bits[..., j] & 0xFF).to(torch.uint8)
        blocks[..., at + 1] = (bits[..., j] >> 8).to(torch.uint8)
    if qtype in (Q4_K.code, Q5_K.code) and extremes:
        blocks[-1, 0, 4:16] = 0xFF
        blocks[-1, -1, 4:16] = 0x00
    if qtype == Q6_K.code and extremes:
        blocks[0:2, 0, 192:208] = 0x80
        blocks[0:2, 1, 192:208] = 0x7F
    return blocks.reshape(rows, -1)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("fmt", REPACKED, ids=lambda f: f.name)
def test_repack_dequantizes_bit_for_bit_like_the_reference(fmt: BlockFormat) -> None:
    """Random blocks with finite but extreme scales and minimums: the Int4Weight's or Int8Weight's values are the
    reference's (and gguf.quants') bits, element order inside the blocks included; its layout and size per
    weight."""
    gen = torch.Generator().manual_seed(fmt.code)
    rows, k = 24, 1024
    blocks = random_blocks(fmt.code, rows, k, gen)
    w = repack_blocks(blocks, fmt.code, k)
    assert w.shape == (rows, k) and _layout(w) == REPACKED_LAYOUT[fmt.code]
    assert isinstance(w, Int8Weight) or w.perm is None
    want = dequantize_blocks(blocks, fmt.code)
    assert _bits(dequantize_weight(w)).equal(_bits(want))
    with np.errstate(all="ignore"):
        theirs = gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType(fmt.code))
    assert _bits(torch.from_numpy(np.asarray(theirs, dtype=np.float32)).reshape(rows, k)).equal(_bits(want))
    assert 8 * w.nbytes() / (rows * k) == REPACKED_BPW[fmt.code]
    assert 8 * blocks.numel() / (rows * k) == BLOCK_BPW[fmt.code]


def test_repack_refuses_other_types_and_ragged_rows() -> None:
    blocks = random_blocks(Q4_0.code, 2, 64, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="not one of"):
        repack_blocks(blocks, gguf.GGMLQuantizationType.Q5_0.value, 64)
    with pytest.raises(ValueError, match="do not hold"):
        repack_blocks(blocks, Q4_0.code, 96)
    with pytest.raises(ValueError, match="do not hold"):
        repack_blocks(blocks, Q8_0.code, 64)
    assert {f.code for f in REPACKED} == REPACKED_TYPES


# GGUF types of each layer's linears in the mixed file: stacked and fused slots of every kind
MIXED_TYPES = (
    {"attn_q": Q4_K, "attn_k": Q4_K, "attn_v": Q6_K, "attn_output": Q4_0, "ffn_gate": Q4_1, "ffn_up": Q4_1,
     "ffn_down": Q8_0},
    {"attn_q": Q4_0, "attn_k": Q4_0, "attn_v": Q4_0, "attn_output": Q4_1, "ffn_gate": Q4_K, "ffn_up": Q4_1,
     "ffn_down": Q4_K},
    {"attn_q": Q8_0, "attn_k": Q8_0, "attn_v": Q8_0, "attn_output": Q6_K, "ffn_gate": Q6_K, "ffn_up": Q6_K,
     "ffn_down": Q8_0},
    {"attn_q": Q5_K, "attn_k": Q5_K, "attn_v": Q5_K, "attn_output": Q5_K, "ffn_gate": Q5_K, "ffn_up": Q4_K,
     "ffn_down": Q5_K},
)
MIXED_LAYOUTS = {"int4-mins-float32+int4-mins-float32+int8-g16-float32", "int4-zeros-float16", "int4-mins-float16",
                 "int8-g32-float16", "int4-mins-float32+int4-mins-float16", "int4-mins-float32", "int8-g16-float32",
                 "int8-g32-mins-float32", "int8-g32-mins-float32+int4-mins-float32"}
MIXED = {"hidden": 256, "inter": 512, "heads": 4, "kv_heads": 2, "vocab": 512}


def _gguf_blocks(a: np.ndarray, fmt: BlockFormat) -> np.ndarray:
    if fmt.code in QUANTIZABLE_TYPES:
        return quantize_blocks(torch.from_numpy(a), fmt.code).numpy()
    return gguf.quants.quantize(a, gguf.GGMLQuantizationType(fmt.code))


def write_mixed_gguf(path: Path) -> Path:
    """A 2-layer llama GGUF whose linears are of the types MIXED_TYPES lists (random weights, F32 the rest)."""
    h, inter, heads, kv = MIXED["hidden"], MIXED["inter"], MIXED["heads"], MIXED["kv_heads"]
    kv_rows = kv * h // heads
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(len(MIXED_TYPES))
    w.add_context_length(128)
    w.add_embedding_length(h)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(MIXED["vocab"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_tensor("token_embd.weight", rng.standard_normal((MIXED["vocab"], h), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    w.add_tensor("output.weight", 0.05 * rng.standard_normal((MIXED["vocab"], h), dtype=np.float32))
    shapes = {"attn_q": (h, h), "attn_k": (kv_rows, h), "attn_v": (kv_rows, h), "attn_output": (h, h),
              "ffn_gate": (inter, h), "ffn_up": (inter, h), "ffn_down": (h, inter)}
    for layer, types in enumerate(MIXED_TYPES):
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{layer}.{norm}.weight", np.ones(h, dtype=np.float32))
        for name, shape in shapes.items():
            a = 0.08 * rng.standard_normal(shape, dtype=np.float32)
            fmt = types[name]
            w.add_tensor(f"blk.{layer}.{name}.weight", _gguf_blocks(a, fmt),
                         raw_dtype=gguf.GGMLQuantizationType(fmt.code))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_mixed_gguf_repacked_gives_the_dequantized_logits(tmp_path) -> None:
    """A file of every repacked type (same-slot mixes stacked, like layouts fused: an all-Q8_0 q/k/v and a Q6_K
    gate/up become one Int8Weight each): the repacked model, the blocks-only model and the dense dequantized
    model give the same logits in fp32."""
    path = write_mixed_gguf(tmp_path / "mixed.gguf")
    repacked, config = _load_kept_quantized(path, repack=True)
    blocks, _ = _load_kept_quantized(path, repack=False)
    dense, _ = load_model(path)
    assert _layouts(repacked) == MIXED_LAYOUTS
    assert _layouts(blocks) == {"Q4_K+Q4_K+Q6_K", "Q4_0", "Q4_1", "Q8_0", "Q4_K+Q4_1", "Q4_K", "Q6_K", "Q5_K",
                                "Q5_K+Q4_K"}
    for r, b in zip(repacked.linear_slots(), blocks.linear_slots()):  # the same values, rows in the same order
        assert _bits(dequantize_weight(r.weight)).equal(_bits(dequantize_weight(b.weight)))
    ids = [1, 7, 300, 42, 5, 511, 64, 2]
    want = prefill_logits(dense, config, ids)
    torch.testing.assert_close(prefill_logits(repacked, config, ids), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(prefill_logits(blocks, config, ids), want, rtol=1e-5, atol=1e-5)



def matmul_blocks(fmt: BlockFormat, rows: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """`random_blocks` with the magnitudes of a real layer (d ~ 1e-3..1e-2, minimums a few d): for matmuls."""
    blocks = random_blocks(fmt.code, rows, k, gen, extremes=False).reshape(rows, k // fmt.block_elems, -1)
    d = torch.rand(rows, blocks.shape[1], 1, generator=gen) * 0.01 + 0.001
    offsets = HALF_FIELDS[fmt.code]
    fields = d if len(offsets) == 1 else torch.cat([d, d * 8 * torch.rand(d.shape, generator=gen)], dim=-1)
    if fmt.code == Q4_1.code:
        fields[..., 1] *= -1  # m: the block's minimum, below zero
    halves = fields.half().view(torch.uint8)
    for j, at in enumerate(offsets):
        blocks[..., at:at + 2] = halves[..., 2 * j:2 * j + 2]
    return blocks.reshape(rows, -1)


def repacked_kernel_errors(device: str, n: int, k: int, rows: tuple[int, ...], dtype: str) -> dict[str, float]:
    """Per repacked type, on `device`: "<type>-dequant", how many values the Triton dequantization of the
    Int4Weight or Int8Weight gives other than the reference decode of the blocks; "<type>-m<rows>", the relative
    error of the Triton matmul on it against the reference matmul on the blocks (fp32 copies of x)."""
    from radixgen.kernels import quant_linear_reference
    from radixgen.kernels.dequant_matmul_triton import dequant_matmul_triton, dequantize_triton

    gen = torch.Generator().manual_seed(11)
    out: dict[str, float] = {}
    for fmt in REPACKED:
        blocks = matmul_blocks(fmt, n, k, gen).to(device)
        w = repack_blocks(blocks, fmt.code, k)
        want = dequantize_blocks(blocks, fmt.code)
        out[f"{fmt.name}-dequant"] = float((_bits(dequantize_triton(w, torch.float32)) != _bits(want)).sum())
        for m in rows:
            x = torch.randn(m, k, generator=gen).to(device=device, dtype=getattr(torch, dtype))
            ref = quant_linear_reference(x.float(), GGUFWeight(blocks, fmt.code, k)).double()
            got = dequant_matmul_triton(x, w).double()
            out[f"{fmt.name}-m{m}"] = ((got - ref).norm() / ref.norm()).item()
    return out


def _check_kernel_errors(errors: dict[str, float], tolerance: float) -> None:
    assert len(errors) > 0
    for key, error in errors.items():
        assert error == 0 if key.endswith("-dequant") else error < tolerance, (key, error)


def test_triton_interpret_runs_repacked_weights_like_the_reference() -> None:
    """The int4 and int8 kernels (one-row GEMV, few-row broadcast product, tiled matmul, dequantization) on
    repacked weights, under the Triton interpreter at small shapes (K = 768: GEMV steps that do not divide it)."""
    from quant_kernel_cases import TOLERANCE

    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_quant_gguf as t; "
            "print(json.dumps(t.repacked_kernel_errors('cpu', 40, 768, (1, 3, 20), 'float32')))")
    errors = run_interpreted(["-c", code], "CUDA present: test_cuda_runs_repacked_weights_like_the_reference")
    assert set(errors) == {f"{f.name}-{s}" for f in REPACKED for s in ("dequant", "m1", "m3", "m20")}
    _check_kernel_errors(errors, TOLERANCE[torch.float32])


@pytest.mark.gpu
def test_cuda_runs_repacked_weights_like_the_reference() -> None:
    """At a real size (Llama-3-8B's fused q/k/v): the repack on the GPU is the CPU's bit for bit, and the compiled
    int4 and int8 kernels on it match the reference on the blocks."""
    from quant_kernel_cases import TOLERANCE

    def tensors(w: Int4Weight | Int8Weight) -> tuple[torch.Tensor, ...]:
        return (w.qweight, w.scales) + ((w.offsets,) if isinstance(w, Int4Weight) else
                                        (w.mins,) if w.mins is not None else ())

    gen = torch.Generator().manual_seed(3)
    for fmt in REPACKED:
        blocks = random_blocks(fmt.code, 6144, 4096, gen)
        on_gpu, on_cpu = repack_blocks(blocks.cuda(), fmt.code, 4096), repack_blocks(blocks, fmt.code, 4096)
        for a, b in zip(tensors(on_gpu), tensors(on_cpu), strict=True):
            assert torch.equal(a.cpu().view(torch.uint8), b.view(torch.uint8)), fmt.name
    _check_kernel_errors(repacked_kernel_errors("cuda", 6144, 4096, (1, 4, 16, 64), "bfloat16"),
                         TOLERANCE[torch.bfloat16])
