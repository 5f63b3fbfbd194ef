"""Small quantized checkpoints written in the test from a random model: GPTQ (act-order or not), AWQ, FP8
(per-tensor, per-channel compressed-tensors, block-wise), each beside the dense checkpoint of exactly the weights
it dequantizes to. The packers below follow the published layouts (AutoGPTQ, AutoAWQ, compressed-tensors) with
their own code, not radixgen's converters, so a loader bug cannot cancel itself out.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from radixgen.runtime.attention import attention_backend_for
from radixgen.runtime.forward_batch import forward_batch_from_lists
from radixgen.runtime.kv_pool import KVPool, ReqToTokenPool, SlotAllocator

SMOLLM2_TOKENIZER = Path(__file__).parent / "fixtures" / "tokenizers" / "smollm2-135m-instruct.tokenizer.gguf"
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
}
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")
# modules fed the same input share an act-order permutation (GPTQ's Hessian is the same)
_SAME_INPUT = {"self_attn.k_proj": "self_attn.q_proj", "self_attn.v_proj": "self_attn.q_proj",
               "mlp.up_proj": "mlp.gate_proj"}
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def random_dense(config: dict = CONFIG, seed: int = 0) -> dict[str, torch.Tensor]:
    """HF-named fp32 tensors of a random model of `config`."""
    gen = torch.Generator().manual_seed(seed)
    c, out = config, {}
    h, inter, hd = c["hidden_size"], c["intermediate_size"], c["hidden_size"] // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    out["model.embed_tokens.weight"] = torch.randn(c["vocab_size"], h, generator=gen)
    out["lm_head.weight"] = torch.randn(c["vocab_size"], h, generator=gen) * 0.1
    out["model.norm.weight"] = torch.ones(h)
    shapes = {"self_attn.q_proj": (h, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
              "self_attn.o_proj": (h, h), "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
              "mlp.down_proj": (h, inter)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = torch.ones(h)
        out[p + "post_attention_layernorm.weight"] = torch.ones(h)
        for name, shape in shapes.items():
            out[f"{p}{name}.weight"] = torch.randn(*shape, generator=gen) * 0.15
    return out


def _pack_rows(q: np.ndarray) -> np.ndarray:
    """[R, C] in 0..15 -> int32 [R / 8, C]: word r, nibble i = row 8r + i."""
    words = np.zeros((q.shape[0] // 8, q.shape[1]), dtype=np.uint32)
    for i in range(8):
        words |= q[i::8].astype(np.uint32) << np.uint32(4 * i)
    return words.view(np.int32)


def _pack_cols(q: np.ndarray, order: tuple[int, ...] = tuple(range(8))) -> np.ndarray:
    """[R, C] in 0..15 -> int32 [R, C / 8]: word c, nibble i = column 8c + order[i]."""
    words = np.zeros((q.shape[0], q.shape[1] // 8), dtype=np.uint32)
    for i in range(8):
        words |= q[:, order[i]::8].astype(np.uint32) << np.uint32(4 * i)
    return words.view(np.int32)


def _group_quantize(w: np.ndarray, g_idx: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w [N, K] -> (q [K, N], zeros [G, N] in 1..15, scales fp16 [G, N]), asymmetric per (group, column)."""
    n, k = w.shape
    scales = np.zeros((groups, n), dtype=np.float16)
    zeros = np.zeros((groups, n), dtype=np.int64)
    q = np.zeros((k, n), dtype=np.int64)
    for j in range(groups):
        rows = np.nonzero(g_idx == j)[0]
        block = w[:, rows]  # [N, g]
        lo, hi = np.minimum(block.min(1), 0), np.maximum(block.max(1), 0)
        s = ((hi - lo) / 15).astype(np.float16)
        z = np.clip(np.round(-lo / s.astype(np.float32)), 1, 15)
        scales[j], zeros[j] = s, z
        q[rows] = np.clip(np.round(block.T / s.astype(np.float32)) + z, 0, 15)
    return q, zeros, scales


def _dequantized(q: np.ndarray, zeros: np.ndarray, scales: np.ndarray, g_idx: np.ndarray) -> torch.Tensor:
    """[N, K] fp32: (q - zero) * scale with each row's group."""
    w = (q.astype(np.float32) - zeros[g_idx].astype(np.float32)) * scales[g_idx].astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(w.T))


def _write(folder: Path, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def write_int4_checkpoint(folder: Path, method: str, group: int, act_order: bool = False,
                          seed: int = 0) -> tuple[Path, Path]:
    """(GPTQ or AWQ checkpoint, the dense checkpoint of its dequantized weights)."""
    rng = np.random.default_rng(seed)
    dense = random_dense(seed=seed)
    packed, reference = dict(dense), dict(dense)
    perms: dict[str, np.ndarray] = {}
    for i in range(CONFIG["num_hidden_layers"]):
        for name in LINEARS:
            key = f"model.layers.{i}.{name}"
            w = dense[key + ".weight"].numpy()
            k = w.shape[1]
            groups = k // group
            if act_order:
                order = perms.setdefault(_SAME_INPUT.get(name, name) + str(i), rng.permutation(k))
                g_idx = np.empty(k, dtype=np.int64)
                g_idx[order] = np.arange(k) // group
            else:
                g_idx = np.arange(k) // group
            q, zeros, scales = _group_quantize(w, g_idx, groups)
            del packed[key + ".weight"]
            if method == "gptq":
                packed[key + ".qweight"] = torch.from_numpy(_pack_rows(q))
                packed[key + ".qzeros"] = torch.from_numpy(_pack_cols(zeros - 1))  # the v1 format stores zero - 1
                packed[key + ".g_idx"] = torch.from_numpy(g_idx.astype(np.int32))
            else:
                packed[key + ".qweight"] = torch.from_numpy(_pack_cols(q, AWQ_ORDER))
                packed[key + ".qzeros"] = torch.from_numpy(_pack_cols(zeros, AWQ_ORDER))
            packed[key + ".scales"] = torch.from_numpy(scales)
            reference[key + ".weight"] = _dequantized(q, zeros, scales, g_idx)
    quant = ({"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order, "sym": False}
             if method == "gptq" else {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                                        "version": "gemm"})
    return (_write(folder / method, packed, {**CONFIG, "quantization_config": quant}),
            _write(folder / f"{method}-dequantized", reference, CONFIG))


def write_fp8_checkpoint(folder: Path, layout: str, seed: int = 0) -> tuple[Path, Path]:
    """(FP8 checkpoint in `layout` = "fp8-tensor" | "fp8-block" | "compressed-tensors", dense dequantized twin)."""
    dense = random_dense(seed=seed)
    packed, reference = dict(dense), dict(dense)
    for i in range(CONFIG["num_hidden_layers"]):
        for name in LINEARS:
            key = f"model.layers.{i}.{name}"
            w = dense[key + ".weight"]
            n, k = w.shape
            if layout == "fp8-block":
                blocks = w.reshape(n // 32, 32, k // 32, 32).abs().amax(dim=(1, 3))
                scale = blocks / 448.0
                full = scale.repeat_interleave(32, 0).repeat_interleave(32, 1)
                q = (w / full).to(torch.float8_e4m3fn)
                packed[key + ".weight_scale_inv"] = scale
                reference[key + ".weight"] = q.float() * full
            else:
                scale = (w.abs().amax() / 448.0).reshape(()) if layout == "fp8-tensor" else \
                    (w.abs().amax(dim=1, keepdim=True) / 448.0)
                q = (w / scale).to(torch.float8_e4m3fn)
                packed[key + ".weight_scale"] = scale
                packed[key + ".input_scale"] = torch.tensor(0.01)
                reference[key + ".weight"] = q.float() * scale
            packed[key + ".weight"] = q
    if layout == "compressed-tensors":
        quant = {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
                 "config_groups": {"group_0": {"targets": ["Linear"],
                                               "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                                                           "symmetric": True, "dynamic": False},
                                               "input_activations": {"num_bits": 8, "type": "float",
                                                                     "strategy": "token", "dynamic": True}}}}
    elif layout == "fp8-block":
        quant = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32]}
    else:
        quant = {"quant_method": "fp8", "activation_scheme": "static"}
    return (_write(folder / layout, packed, {**CONFIG, "quantization_config": quant}),
            _write(folder / f"{layout}-dequantized", reference, CONFIG))


@torch.inference_mode()
def prefill_logits(model, config, ids: list[int]) -> torch.Tensor:
    """Logits of every position of one prompt, through the KV pool as the engine runs it (CPU)."""
    pool = KVPool.for_model(config, len(ids) + 8, model.dtype, model.device)
    attention = attention_backend_for(config, pool.device, model.dtype)
    table = ReqToTokenPool(1, len(ids) + 8, model.device)
    row = table.alloc()
    slots = SlotAllocator(len(ids) + 8).alloc(len(ids))
    table.write(row, 0, slots)
    batch = forward_batch_from_lists([ids], [0], [row], table.req_to_token, torch.from_numpy(slots).to(model.device),
                                     logits_indices=torch.arange(len(ids), device=model.device))
    return model(batch, pool, attention, attention.plan(batch)).float().cpu()
