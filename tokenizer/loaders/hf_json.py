"""tokenizer.json (+ tokenizer_config.json / generation_config.json beside it) -> TokenizerSpec."""

from __future__ import annotations

import json
from pathlib import Path

from ..added_tokens import AddedToken
from ..bpe import BPEModel, merge_pair
from ..spec import TokenizerSpec


def _token_text(value: str | dict | None) -> str | None:
    """tokenizer_config.json writes special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _post_processor_ids(spec: dict | None) -> tuple[list[int], list[int]]:
    """Ids a post-processor adds before and after a single sequence."""
    if spec is None:
        return [], []
    kind = spec["type"]
    if kind == "Sequence":
        prefix: list[int] = []
        suffix: list[int] = []
        for sub in spec["processors"]:
            p, s = _post_processor_ids(sub)
            prefix += p
            suffix = s + suffix
        return prefix, suffix
    if kind == "TemplateProcessing":
        specials = spec.get("special_tokens", {})
        prefix, suffix = [], []
        seen_sequence = False
        for item in spec["single"]:
            if "Sequence" in item:
                seen_sequence = True
                continue
            ids = specials[item["SpecialToken"]["id"]]["ids"]
            (suffix if seen_sequence else prefix).extend(ids)
        return prefix, suffix
    if kind in ("BertProcessing", "RobertaProcessing"):
        return [spec["cls"][1]], [spec["sep"][1]]
    if kind == "ByteLevel":
        return [], []
    raise ValueError(f"unsupported post-processor type {kind!r}")


def _chat_template(config: dict) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t["name"]: t["template"] for t in template}
        return named.get("default", next(iter(named.values()), None))
    return template


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def load_tokenizer_json(path: Path) -> TokenizerSpec:
    """Read a tokenizer.json file, or a folder holding one (its config files are read too when present)."""
    folder = path if path.is_dir() else path.parent
    json_path = path / "tokenizer.json" if path.is_dir() else path
    data = json.loads(json_path.read_text(encoding="utf-8"))
    # Config files beside it belong to it when we were given the folder or a file named tokenizer.json.
    with_configs = path.is_dir() or path.name == "tokenizer.json"
    config = _read_json(folder / "tokenizer_config.json") if with_configs else {}
    generation = _read_json(folder / "generation_config.json") if with_configs else {}
    template_file = folder / "chat_template.jinja"  # newer folders keep the template here
    file_template = (
        template_file.read_text(encoding="utf-8") if with_configs and template_file.exists() else None
    )

    model_spec = data["model"]
    if model_spec.get("type", "BPE") != "BPE":
        raise ValueError(f"unsupported model type {model_spec.get('type')!r}; only BPE is implemented")
    if model_spec.get("continuing_subword_prefix") or model_spec.get("end_of_word_suffix"):
        raise ValueError("BPE with continuing_subword_prefix / end_of_word_suffix is not supported")
    vocab: dict[str, int] = model_spec["vocab"]
    merges = [merge_pair(m) for m in model_spec["merges"]]
    unk_token = model_spec.get("unk_token")
    model = BPEModel.from_merges(
        vocab,
        merges,
        byte_fallback=bool(model_spec.get("byte_fallback", False)),
        unk_id=vocab.get(unk_token) if unk_token is not None else None,
        fuse_unk=bool(model_spec.get("fuse_unk", False)),
        ignore_merges=bool(model_spec.get("ignore_merges", False)),
    )
    added = [
        AddedToken(
            id=t["id"],
            content=t["content"],
            special=t.get("special", False),
            lstrip=t.get("lstrip", False),
            rstrip=t.get("rstrip", False),
            single_word=t.get("single_word", False),
            normalized=t.get("normalized", not t.get("special", False)),
        )
        for t in data.get("added_tokens") or []
    ]
    prefix, suffix = _post_processor_ids(data.get("post_processor"))
    by_content = {t.content: t.id for t in added} | vocab
    bos = _token_text(config.get("bos_token"))
    eos = _token_text(config.get("eos_token"))
    # transformers rebuilds the post-processor from these flags for Llama-style tokenizers
    processor = (data.get("post_processor") or {}).get("type")
    if ("add_bos_token" in config or "add_eos_token" in config) and processor in (
        None,
        "TemplateProcessing",
        "ByteLevel",
    ):
        prefix = [by_content[bos]] if config.get("add_bos_token") and bos in by_content else []
        suffix = [by_content[eos]] if config.get("add_eos_token") and eos in by_content else []
    extra_eos = generation.get("eos_token_id", [])
    extra_eos = [extra_eos] if isinstance(extra_eos, int) else list(extra_eos)
    return TokenizerSpec(
        model=model,
        added_tokens=added,
        normalizer=data.get("normalizer"),
        pre_tokenizer=data.get("pre_tokenizer"),
        decoder=data.get("decoder"),
        prefix_ids=prefix,
        suffix_ids=suffix,
        bos_token=bos,
        eos_token=eos,
        pad_token=_token_text(config.get("pad_token")),
        unk_token=_token_text(config.get("unk_token")) or unk_token,
        extra_eos_ids=extra_eos,
        chat_template=_chat_template(config) or file_template,
    )
