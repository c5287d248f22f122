"""Serving metrics in the Prometheus text exposition format (version 0.0.4).

Counters, gauges and histograms are thread-safe (the engine thread and the HTTP loop both update
them); `ServingMetrics.render()` is the `/metrics` body.
"""

import math
import threading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
RATIO_BUCKETS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0)


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = ()):
        self.name, self.help, self.label_names = name, help_text, labels
        self._lock = threading.Lock()

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, amount: float = 1.0, *labels: str) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0.0) + amount

    def value(self, *labels: str) -> float:
        return self._values.get(labels, 0.0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items()) or ([((), 0.0)] if not self.label_names else [])
        return self.header() + [f"{self.name}{_labels(self.label_names, k)} {_number(v)}" for k, v in items]


class Gauge(Counter):
    kind = "gauge"

    def set(self, value: float, *labels: str) -> None:
        with self._lock:
            self._values[labels] = float(value)


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]):
        super().__init__(name, help_text)
        self.buckets = tuple(buckets) + (math.inf,)
        self._counts = [0] * len(self.buckets)
        self._sum, self._count = 0.0, 0

    def observe(self, value: float) -> None:
        with self._lock:
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    self._counts[i] += 1
            self._sum += value
            self._count += 1

    @property
    def count(self) -> int:
        return self._count

    def render(self) -> list[str]:
        with self._lock:
            lines = [f'{self.name}_bucket{{le="{_number(b)}"}} {c}' for b, c in zip(self.buckets, self._counts)]
            lines += [f"{self.name}_sum {_number(self._sum)}", f"{self.name}_count {self._count}"]
        return self.header() + lines


class ServingMetrics:
    """Everything `/metrics` reports."""

    def __init__(self):
        self.requests = Counter("clover_requests_total", "Finished generation requests by endpoint and "
                                "finish reason.", ("endpoint", "finish_reason"))
        self.http_responses = Counter("clover_http_responses_total", "HTTP responses by status code.",
                                      ("code",))
        self.queue_depth = Gauge("clover_queue_depth", "Requests waiting for admission.")
        self.running = Gauge("clover_running_requests", "Requests in the running batch.")
        self.prompt_tokens = Counter("clover_prompt_tokens_total", "Prompt tokens prefilled.")
        self.prefix_hit_tokens = Counter("clover_prefix_cache_hit_tokens_total",
                                         "Prompt tokens restored from the prefix cache.")
        self.prefix_miss_tokens = Counter("clover_prefix_cache_miss_tokens_total",
                                          "Prompt tokens not found in the prefix cache (prefilled).")
        self.generation_tokens = Counter("clover_generation_tokens_total", "Response tokens committed.")
        self.forward_passes = Counter("clover_forward_passes_total", "Model forward passes (one per "
                                      "group of rows that share a shape).")
        self.row_forwards = Counter("clover_row_forwards_total", "Sum over forwards of the rows each ran.")
        self.tokens_per_forward = Histogram("clover_request_tokens_per_forward", "Response tokens per "
                                            "forward a request took part in.", RATIO_BUCKETS)
        self.latency = Histogram("clover_request_latency_seconds", "End-to-end request latency.",
                                 LATENCY_BUCKETS)
        self.first_block = Histogram("clover_time_to_first_block_seconds", "Time from arrival to the "
                                     "first committed block.", LATENCY_BUCKETS)
        self.queue_time = Histogram("clover_queue_time_seconds", "Time from arrival to admission.",
                                    LATENCY_BUCKETS)
        self.step_time = Histogram("clover_engine_step_seconds", "Duration of one engine step (all its "
                                   "forwards).", LATENCY_BUCKETS)

    def all(self) -> list[_Metric]:
        return [v for v in vars(self).values() if isinstance(v, _Metric)]

    def render(self) -> str:
        return "\n".join(line for m in self.all() for line in m.render()) + "\n"
