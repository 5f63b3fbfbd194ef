"""Batch: one program over a list of inputs with run_batch (progress bar), eagerly and as a compiled plan.

    python examples/batch.py
"""

from __future__ import annotations

import time

import radixgen as sgl


@sgl.function
def capital(s, country, max_tokens=8):
    s += "Give the capital city of each country.\n\n"
    s += "Country: France\nCapital: Paris\n\nCountry: Japan\nCapital: Tokyo\n\n"
    s += "Country: " + country + "\nCapital:" + sgl.gen("capital", max_tokens=max_tokens, stop="\n")


COUNTRIES = ["Italy", "Spain", "Germany", "Canada", "Egypt", "Kenya", "Brazil", "Peru"]


def run(backend, max_tokens: int = 8, progress_bar: bool = False) -> dict:
    batch = [{"country": c, "max_tokens": max_tokens} for c in COUNTRIES]
    start = time.perf_counter()
    eager = capital.run_batch(batch, backend=backend, temperature=0, progress_bar=progress_bar)
    eager_s = time.perf_counter() - start
    start = time.perf_counter()
    plan = capital.bind(max_tokens=max_tokens).compile()
    compiled = plan.run_batch([{"country": c} for c in COUNTRIES], backend=backend, temperature=0)
    compiled_s = time.perf_counter() - start
    return {"eager": [s["capital"].strip() for s in eager], "compiled": [s["capital"].strip() for s in compiled],
            "errors": [s.error() for s in eager if s.error()], "eager_s": eager_s, "compiled_s": compiled_s}


def main(argv: list[str] | None = None) -> None:
    args, backend = sgl.lang.script_backend(__doc__, 8, argv)
    out = run(backend, args.max_tokens, progress_bar=True)
    for country, city in zip(COUNTRIES, out["eager"]):
        print(f"{country:>8}: {city}")
    print(f"eager {out['eager_s']:.2f}s, compiled {out['compiled_s']:.2f}s")


if __name__ == "__main__":
    main()
