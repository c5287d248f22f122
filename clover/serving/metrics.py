"""What `/metrics` reports, kept with `prometheus_client` in a registry of each app's own (not the
library's global one, so several apps in one process never collide).

prometheus_client metrics are thread-safe (the engine thread and the HTTP loop both update them).
Labelled counters are updated through `.labels(...)`; `value(sample, **labels)` reads one sample.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
RATIO_BUCKETS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0)


class ServingMetrics:
    """Everything `/metrics` reports, in `self.registry`."""

    def __init__(self):
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("clover_requests_total", "Finished generation requests by endpoint and "
                                "finish reason.", ("endpoint", "finish_reason"), registry=registry)
        self.http_responses = Counter("clover_http_responses_total", "HTTP responses by status code.",
                                      ("code",), registry=registry)
        self.queue_depth = Gauge("clover_queue_depth", "Requests waiting for admission.", registry=registry)
        self.running = Gauge("clover_running_requests", "Requests in the running batch.", registry=registry)
        self.prompt_tokens = Counter("clover_prompt_tokens_total", "Prompt tokens prefilled.", registry=registry)
        self.prefix_hit_tokens = Counter("clover_prefix_cache_hit_tokens_total",
                                         "Prompt tokens restored from the prefix cache.", registry=registry)
        self.prefix_miss_tokens = Counter("clover_prefix_cache_miss_tokens_total",
                                          "Prompt tokens not found in the prefix cache (prefilled).",
                                          registry=registry)
        self.generation_tokens = Counter("clover_generation_tokens_total", "Response tokens committed.",
                                         registry=registry)
        self.forward_passes = Counter("clover_forward_passes_total", "Model forward passes (one per "
                                      "group of rows that share a shape).", registry=registry)
        self.row_forwards = Counter("clover_row_forwards_total", "Sum over forwards of the rows each ran.",
                                    registry=registry)
        self.tokens_per_forward = Histogram("clover_request_tokens_per_forward", "Response tokens per "
                                            "forward a request took part in.", buckets=RATIO_BUCKETS,
                                            registry=registry)
        self.latency = Histogram("clover_request_latency_seconds", "End-to-end request latency.",
                                 buckets=LATENCY_BUCKETS, registry=registry)
        self.first_block = Histogram("clover_time_to_first_block_seconds", "Time from arrival to the "
                                     "first committed block.", buckets=LATENCY_BUCKETS, registry=registry)
        self.queue_time = Histogram("clover_queue_time_seconds", "Time from arrival to admission.",
                                    buckets=LATENCY_BUCKETS, registry=registry)
        self.step_time = Histogram("clover_engine_step_seconds", "Duration of one engine step (all its "
                                   "forwards).", buckets=LATENCY_BUCKETS, registry=registry)

    def value(self, sample: str, **labels: str) -> float:
        """One sample's value as exposed (e.g. `value("clover_requests_total", endpoint="chat",
        finish_reason="stop")`); 0 for a labelled series not seen yet."""
        found = self.registry.get_sample_value(sample, labels)
        return 0.0 if found is None else found

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The `/metrics` body and its content type, in the format the `Accept` header asks for
        (OpenMetrics or the Prometheus text format, 0.0.4 by default)."""
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type
