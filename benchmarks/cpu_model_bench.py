"""Load time and greedy decode speed of the default model on the CPU: radixgen next to transformers, one run.

Both load the same GGUF file (SmolLM2-135M-Instruct, Q4_1, dequantized to float32) and decode the same chat
prompt greedily, one token per step with a KV cache. Decode steps of the two systems alternate in blocks of 8,
so a machine shared with other work slows both alike; decode tok/s excludes the prefill.

    python benchmarks/cpu_model_bench.py [--tokens 64] [--threads N] [--model PATH]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
BLOCK = 8  # decode steps per turn when alternating


class RadixgenGreedy:
    """One request on a ModelRunner: prefill, then one token per step."""

    def __init__(self, path: Path, max_tokens: int) -> None:
        from radixgen.runtime.engine_config import EngineConfig
        from radixgen.runtime.model_runner import ModelRunner

        self.runner = ModelRunner(EngineConfig(model_path=str(path), device="cpu", dtype="float32",
                                               max_total_tokens=max_tokens, max_running_requests=1))
        self.row = self.runner.req_to_token_pool.alloc()
        self.lens = [0]  # tokens the request holds (`extend` updates it)

    def _run(self, ids: list[int]) -> int:
        from cpu_decode_step import extend  # benchmarks/ is the script's directory

        return int(extend(self.runner, [self.row], self.lens, [ids])[0].argmax())

    def prefill(self, ids: list[int]) -> int:
        return self._run(ids)

    def step(self, token: int) -> int:
        return self._run([token])


class TransformersGreedy:
    """The same loop on transformers' LlamaForCausalLM with its dynamic KV cache."""

    def __init__(self, path: Path) -> None:
        import transformers

        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
        self.cache = None

    @torch.inference_mode()
    def _run(self, ids: list[int]) -> int:
        out = self.model(torch.tensor([ids]), past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return int(out.logits[0, -1].argmax())

    def prefill(self, ids: list[int]) -> int:
        return self._run(ids)

    def step(self, token: int) -> int:
        return self._run([token])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the cached default model)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from radixgen.runtime.download import default_model_path
    from radixgen.tokenizer import Tokenizer

    path = Path(args.model) if args.model else default_model_path(download=True)
    tok = Tokenizer.from_file(path)
    prompt_ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}]), add_special_tokens=False)

    systems, load_s = {}, {}
    for name, build in (("radixgen", lambda: RadixgenGreedy(path, len(prompt_ids) + args.tokens + 1)),
                        ("transformers", lambda: TransformersGreedy(path))):
        t0 = time.perf_counter()
        systems[name] = build()
        load_s[name] = time.perf_counter() - t0

    prefill_s, decode_s, tokens = {}, dict.fromkeys(systems, 0.0), {}
    for name, system in systems.items():
        t0 = time.perf_counter()
        tokens[name] = [system.prefill(prompt_ids)]
        prefill_s[name] = time.perf_counter() - t0
    while len(tokens["radixgen"]) < args.tokens:
        n = min(BLOCK, args.tokens - len(tokens["radixgen"]))
        for name, system in systems.items():
            t0 = time.perf_counter()
            for _ in range(n):
                tokens[name].append(system.step(tokens[name][-1]))
            decode_s[name] += time.perf_counter() - t0

    same = tokens["radixgen"] == tokens["transformers"]
    print(f"model {path.name}, prompt {len(prompt_ids)} tokens, {args.tokens} greedy tokens, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; same tokens: {same}")
    print(f"| {'system':<12} | {'load (s)':>8} | {'prefill (ms)':>12} | {'decode (tok/s)':>14} |")
    print(f"|{'-' * 14}|{'-' * 10}|{'-' * 14}|{'-' * 16}|")
    for name in systems:
        rate = (args.tokens - 1) / decode_s[name]
        print(f"| {name:<12} | {load_s[name]:>8.2f} | {prefill_s[name] * 1e3:>12.1f} | {rate:>14.1f} |")


if __name__ == "__main__":
    main()
