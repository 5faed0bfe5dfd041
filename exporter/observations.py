"""What the Ollama proxy has seen so far: requests in flight and token totals per model, read on scrape."""

from __future__ import annotations

import threading
from collections import defaultdict

# Model names come from client requests; past this many distinct ones a name is reported as
# "other" so a client cannot blow up the series count.
MAX_MODELS = 64
OTHER_MODEL = "other"


def normalise_model(name: object) -> str:
    """Ollama's own rule: a name without a tag means ':latest'."""
    if not isinstance(name, str) or not name:
        return ""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


class ProxyObservations:
    """Counts shared between the proxy (event loop thread) and the collector (scrape threads).

    Ollama runs OLLAMA_NUM_PARALLEL requests per loaded model and queues the rest where nobody
    can see them; the proxy sees every request, so running = min(in flight, num_parallel) and
    waiting = the rest, per model.
    """

    def __init__(self, num_parallel: int = 1):
        self.num_parallel = num_parallel
        self._lock = threading.Lock()
        self._in_flight: dict[str, int] = defaultdict(int)
        self._generated: dict[str, int] = defaultdict(int)
        self._prompt: dict[str, int] = defaultdict(int)

    def model_label(self, model: str) -> str:
        with self._lock:
            if model in self._in_flight or len(self._in_flight) < MAX_MODELS:
                return model
        return OTHER_MODEL

    def started(self, model: str) -> None:
        with self._lock:
            self._in_flight[model] += 1

    def finished(self, model: str, *, failed: bool = False) -> None:
        """The key normally stays (the model keeps reporting 0, not nothing); a name that only ever
        failed (a typo, a model that is not installed) is forgotten instead of reported forever."""
        with self._lock:
            self._in_flight[model] -= 1
            if failed and self._in_flight[model] == 0 and model not in self._prompt:
                del self._in_flight[model]

    def tokens(self, model: str, prompt: int, generated: int) -> None:
        with self._lock:
            self._prompt[model] += prompt
            self._generated[model] += generated

    def snapshot(self) -> dict[str, tuple[int, int, int, int]]:
        """model -> (running, waiting, prompt tokens, generated tokens)."""
        with self._lock:
            models = set(self._in_flight) | set(self._prompt)
            return {
                model: (
                    min(self._in_flight.get(model, 0), self.num_parallel),
                    max(self._in_flight.get(model, 0) - self.num_parallel, 0),
                    self._prompt.get(model, 0),
                    self._generated.get(model, 0),
                )
                for model in models
            }

    def in_flight(self) -> int:
        with self._lock:
            return sum(self._in_flight.values())
