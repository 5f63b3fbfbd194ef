"""Time one sampler pass (and one SamplingBatch.build) per configuration, batch size and device.

    python benchmarks/sampler_speed.py [--device cpu|cuda] [--vocab 49152] [--batch 1 8 64 256]

Prints a table of milliseconds per call (best of --repeat after a warm-up): the cost the engine pays per
decode step for sampling, on top of the forward.
"""

from __future__ import annotations

import argparse
import time

import torch

from radixgen.runtime.sampler import Sampler
from radixgen.runtime.sampling_batch import SamplingBatch
from radixgen.runtime.sampling_params import SamplingParams

# name -> (sampling params, logit scale). Scale 4 (random normal logits times 4) is peaked like a language
# model's next-token distribution: a top-p 0.9 nucleus of ~50 tokens. Scale 1 is flat: the nucleus spans
# thousands of tokens, beyond the sampler's candidates, so those rows take the full sort.
CONFIGS: dict[str, tuple[dict, float]] = {
    "greedy": ({"temperature": 0.0}, 4.0),
    "temperature": ({"temperature": 0.8}, 4.0),
    "top_k=40": ({"temperature": 0.8, "top_k": 40}, 4.0),
    "top_p=0.9": ({"temperature": 0.8, "top_p": 0.9}, 4.0),
    "top_p=0.9 flat": ({"temperature": 0.8, "top_p": 0.9}, 1.0),
    "seeded top_p": ({"temperature": 0.8, "top_p": 0.9, "seed": 1}, 4.0),
    "penalties": ({"temperature": 0.8, "frequency_penalty": 0.5, "presence_penalty": 0.3,
                   "repetition_penalty": 1.1}, 4.0),
    "everything": ({"temperature": 0.8, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "frequency_penalty": 0.5,
                    "repetition_penalty": 1.1, "seed": 1, "logit_bias": {5: 1.0}, "min_new_tokens": 5}, 4.0),
}


def best_ms(fn, repeat: int, device: torch.device) -> float:
    fn()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--prompt-len", type=int, default=500)
    ap.add_argument("--output-len", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    device, V = torch.device(args.device), args.vocab
    sampler = Sampler(V, device)
    print(f"device={device} vocab={V} threads={torch.get_num_threads()}; ms per call: sample / build")
    print(f"{'config':16s}" + "".join(f"{'B=' + str(b):>20s}" for b in args.batch))
    for name, (kw, scale) in CONFIGS.items():
        cells = []
        for B in args.batch:
            params = [SamplingParams(**kw)] * B
            prompts = [list(range(i, i + args.prompt_len)) for i in range(B)]
            outputs = [list(range(i, i + args.output_len)) for i in range(B)]

            def build(params=params, prompts=prompts, outputs=outputs) -> SamplingBatch:
                return SamplingBatch.build(params, V, device, eos_token_ids=[2], prompt_ids=prompts,
                                           output_ids=outputs)

            batch = build()
            logits = torch.randn(B, V, device=device) * scale
            t_sample = best_ms(lambda b=batch, x=logits: sampler.sample(b, x), args.repeat, device)
            t_build = best_ms(build, args.repeat, device)
            cells.append(f"{t_sample:9.3f} / {t_build:7.3f}")
        print(f"{name:16s}" + "".join(f"{c:>20s}" for c in cells))


if __name__ == "__main__":
    main()
