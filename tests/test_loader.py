"""Loading HF folders and dummy models, and the one-line errors for what a user can get wrong."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from model_fixtures import TINY_CONFIGS, write_tiny_checkpoint

from radixgen.runtime.config import ModelConfig
from radixgen.runtime.errors import (
    CorruptModelFileError,
    ModelLoadError,
    ModelNotFoundError,
    UnsupportedArchitectureError,
)
from radixgen.runtime.loader import load_model, read_model_config

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "llama", "llama")


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_path():
    with pytest.raises(ModelNotFoundError, match="/no/such/model does not exist"):
        load_model("/no/such/model")


def test_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIGS["llama"]))
    with pytest.raises(ModelNotFoundError, match=r"no \*\.safetensors weights"):
        load_model(tmp_path)


def test_unsupported_architecture_names_it_and_the_supported_ones(llama_folder, tmp_path):
    folder = _copy(llama_folder, tmp_path / "m")
    cfg = {**TINY_CONFIGS["llama"], "architectures": ["GPTNeoXForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError) as err:
        load_model(folder)
    msg = str(err.value)
    assert "GPTNeoXForCausalLM" in msg and "LlamaForCausalLM" in msg and "Qwen3ForCausalLM" in msg
    assert "\n" not in msg


def test_truncated_safetensors_names_the_file(llama_folder, tmp_path):
    folder = _copy(llama_folder, tmp_path / "m")
    shard = folder / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(CorruptModelFileError, match=f"{shard}: truncated or corrupt"):
        load_model(folder)


def test_missing_shard_named_by_the_index(tmp_path):
    folder = write_tiny_checkpoint(tmp_path / "sharded", "llama", max_shard_size="40KB")
    victim = max(folder.glob("*.safetensors"))
    victim.unlink()
    with pytest.raises(CorruptModelFileError, match=f"names shard {victim.name}, which is missing"):
        load_model(folder)


def test_missing_tensor_and_wrong_shape(llama_folder, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _copy(llama_folder, tmp_path / "m")
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CorruptModelFileError, match=r"missing 1 tensor\(s\).*layers\.1\.mlp\.up_proj"):
        load_model(folder)
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(3, 3)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CorruptModelFileError,
                       match=r"up_proj\.weight has shape \(3, 3\), the config implies \(128, 64\)"):
        load_model(folder)


def test_bad_json_and_missing_field(llama_folder, tmp_path):
    folder = _copy(llama_folder, tmp_path / "m")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CorruptModelFileError, match=r"config\.json: not valid JSON"):
        load_model(folder)
    cfg = dict(TINY_CONFIGS["llama"])
    del cfg["hidden_size"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="missing required field 'hidden_size'"):
        load_model(folder)


def test_unsupported_rope_scaling_type():
    cfg = {**TINY_CONFIGS["llama"], "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    with pytest.raises(ModelLoadError, match="unsupported rope_scaling type 'yarn'"):
        ModelConfig.from_hf(cfg)


def test_transformers5_rope_parameters_are_read():
    cfg = {**TINY_CONFIGS["llama3"]}
    scaling = cfg.pop("rope_scaling")
    cfg["rope_parameters"] = {**scaling, "rope_theta": cfg.pop("rope_theta")}
    c = ModelConfig.from_hf(cfg)
    assert c.rope_theta == 500000.0 and c.rope_scaling["rope_type"] == "llama3"
    assert "rope_theta" not in c.rope_scaling


def test_read_config_without_weights(llama_folder):
    c = read_model_config(llama_folder)
    assert (c.architecture, c.num_hidden_layers, c.num_key_value_heads, c.head_dim) == ("llama", 2, 2, 16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dummy_weights_for_any_config(dtype):
    cfg = {**TINY_CONFIGS["qwen3"], "num_hidden_layers": 3, "hidden_size": 96, "num_attention_heads": 6,
           "num_key_value_heads": 3}
    model, config = load_model(None, "dummy", dtype=dtype, dummy_config=cfg)
    assert config.num_hidden_layers == 3 and model.dtype == dtype
    assert all(torch.isfinite(p.float()).all() for p in model.parameters())
    assert float(model.layers[0].input_layernorm.float().mean()) == 1.0
    again, _ = load_model(None, "dummy", dtype=dtype, dummy_config=cfg)
    assert torch.equal(model.embed_tokens, again.embed_tokens)  # seeded


def test_dummy_format_over_a_folder_uses_its_config(llama_folder):
    _, config = load_model(llama_folder, "dummy")
    assert config == read_model_config(llama_folder)


def test_load_to_bfloat16_converts_on_copy(llama_folder):
    ref, _ = load_model(llama_folder)
    model, _ = load_model(llama_folder, dtype=torch.bfloat16)
    assert model.layers[0].self_attn.qkv_proj.dtype == torch.bfloat16
    assert torch.equal(model.norm, ref.norm.to(torch.bfloat16))


def test_dummy_format_over_a_gguf_file_uses_its_metadata(tmp_path):
    from test_loader_gguf import write_gguf

    folder = write_tiny_checkpoint(tmp_path / "qwen3", "qwen3")
    path = write_gguf(tmp_path / "m.gguf", folder, "qwen3")
    _, config = load_model(path, "dummy")
    assert config.architecture == "qwen3" and config.head_dim == 32 and config.qk_norm
