"""Prometheus metrics of one server, in its own `CollectorRegistry` (two apps in one process never collide).

Request-side numbers (status counts, token counts, time to first token, inter-token latency, grammar compile
time) are observed by the server as requests run; engine-side gauges (running, waiting, KV usage, cache hit
rate) are refreshed from `engine.get_stats()` when `/metrics` is scraped.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("radixgen_http_requests", "HTTP requests by route and status code",
                                ["route", "status"], registry=r)
        self.prompt_tokens = Counter("radixgen_prompt_tokens", "prompt tokens of ended generations", registry=r)
        self.generated_tokens = Counter("radixgen_generated_tokens", "tokens generated", registry=r)
        self.cached_tokens = Counter("radixgen_cached_prompt_tokens",
                                     "prompt tokens served from the radix cache", registry=r)
        self.generations = Counter("radixgen_generations",
                                   "ended generations by finish reason (cancelled: the client left first)",
                                   ["reason"], registry=r)
        self.ttft = Histogram("radixgen_time_to_first_token_seconds",
                              "time from submitting a generation to its first token", buckets=_LATENCY_BUCKETS,
                              registry=r)
        self.itl = Histogram("radixgen_inter_token_latency_seconds",
                             "time between consecutive output chunks of one generation (one decode step each)",
                             buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("radixgen_e2e_request_latency_seconds", "latency of a whole generation",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.grammar_compile = Histogram(
            "radixgen_grammar_compile_seconds",
            "time to validate a constrained request and compile its grammar (a cache hit is near zero)",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.running = Gauge("radixgen_running_requests", "requests in the running batch", registry=r)
        self.waiting = Gauge("radixgen_waiting_requests", "requests queued for admission", registry=r)
        self.kv_usage = Gauge("radixgen_kv_usage", "fraction of KV slots in use (cached prefixes included)",
                              registry=r)
        self.kv_cached = Gauge("radixgen_kv_cached_tokens", "KV slots held by the radix cache", registry=r)
        self.cache_hit_rate = Gauge("radixgen_cache_hit_rate",
                                    "cached / prompt tokens over all finished requests", registry=r)
        self.spec_draft_tokens = Gauge("radixgen_spec_draft_tokens",
                                       "speculative decoding: drafted tokens verified since start", registry=r)
        self.spec_accepted_tokens = Gauge("radixgen_spec_accepted_tokens",
                                          "speculative decoding: drafted tokens kept since start", registry=r)
        self.spec_accept_rate = Gauge("radixgen_spec_accept_rate",
                                      "speculative decoding: kept / drafted tokens since start", registry=r)

    def observe_generation(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int, reason: str,
                           e2e: float) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.generated_tokens.inc(completion_tokens)
        self.cached_tokens.inc(cached_tokens)
        self.generations.labels(reason).inc()
        self.e2e.observe(e2e)

    def update_engine(self, stats: dict) -> None:
        """Refresh the gauges from a `engine.get_stats()` snapshot."""
        self.running.set(stats.get("running", 0))
        self.waiting.set(stats.get("waiting", 0))
        self.kv_usage.set(stats.get("kv_usage", 0.0))
        self.kv_cached.set(stats.get("kv_slots_cached", 0))
        prompt = stats.get("prompt_tokens", 0)
        self.cache_hit_rate.set(stats.get("cached_tokens", 0) / prompt if prompt else 0.0)
        drafted = stats.get("spec_draft_tokens", 0)
        self.spec_draft_tokens.set(drafted)
        self.spec_accepted_tokens.set(stats.get("spec_accepted_tokens", 0))
        self.spec_accept_rate.set(stats.get("spec_accepted_tokens", 0) / drafted if drafted else 0.0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
