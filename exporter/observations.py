"""What the Ollama proxy has seen so far: its requests waiting and running, and token totals, per model label, read on scrape.

Model names come from client requests, so the labels they become must stay bounded whatever
clients send (exporter.bounds): a name is bounded in length, and it is a label of its own while
fewer than MAX_MODELS labels exist; it stays one once Ollama has vouched for it (a request for it
succeeded, or the collector saw it in /api/tags or /api/ps). A name Ollama never vouched for (a
typo, a model that is not installed, junk) is forgotten when its last request ends, and its
outcomes count under OVERFLOW_MODEL, as do names past the cap. So the proxy's series exist for at
most MAX_MODELS models plus OVERFLOW_MODEL, whatever clients send.
"""

from __future__ import annotations

import threading

from exporter.bounds import MAX_MODELS, OVERFLOW_MODEL, bounded


def normalise_model(name: object) -> str:
    """Ollama's own rule: a name without a tag means ':latest'."""
    if not isinstance(name, str) or not name:
        return ""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


class ProxyObservations:
    """What the proxy saw of the requests it relayed, shared between the proxy (event loop thread) and the
    collector (scrape threads).

    Each relayed generation request is, per model label, in one of two states the proxy sees for itself:
    waiting (sent to Ollama, not one byte of its answer back yet: queued for one of Ollama's parallel
    slots, waiting for the model to load, or evaluating its prompt; the proxy cannot tell which) and
    running (its answer has begun to stream: Ollama is generating it). Nothing is derived from
    OLLAMA_NUM_PARALLEL: `num_parallel` is only the configured value, exported as what it is.
    """

    def __init__(self, num_parallel: int = 1):
        self.num_parallel = num_parallel
        self._lock = threading.Lock()
        # Every label that exists, only ever created by a relayed request (admit): confirmed ones stay at 0.
        self._in_flight: dict[str, int] = {}
        self._running: dict[str, int] = {}  # of those in flight, the ones whose answer has begun
        self._confirmed: set[str] = {OVERFLOW_MODEL}  # labels whose requests succeeded at least once
        self._listed: frozenset[str] = frozenset()  # labels of the models Ollama listed at the last scrape
        self._generated: dict[str, int] = {}
        self._prompt: dict[str, int] = {}

    def admit(self, name: str) -> str:
        """The label a request for model `name` is counted under while in flight."""
        label = bounded(normalise_model(name))
        with self._lock:
            labels = len(self._in_flight) - (OVERFLOW_MODEL in self._in_flight)
            if label != OVERFLOW_MODEL and (label in self._in_flight or labels < MAX_MODELS):
                self._in_flight.setdefault(label, 0)
                return label
            self._in_flight.setdefault(OVERFLOW_MODEL, 0)
        return OVERFLOW_MODEL

    def listed(self, labels: frozenset[str]) -> None:
        """The models Ollama has installed or loaded, as the collector read them (already bounded)."""
        with self._lock:
            self._listed = labels

    def confirmed(self, label: str) -> bool:
        with self._lock:
            return label in self._confirmed or label in self._listed

    def started(self, label: str) -> None:
        """A request of `label` went upstream: waiting until its answer begins."""
        with self._lock:
            self._in_flight[label] = self._in_flight.get(label, 0) + 1

    def answering(self, label: str) -> None:
        """The first chunk of a request's answer went to its client: it is running from now on."""
        with self._lock:
            self._running[label] = self._running.get(label, 0) + 1

    def finished(self, label: str, *, ok: bool, answered: bool = False) -> str:
        """One request of `label` is over (`answered`: answering() was called for it); returns the label its
        outcome counts under (OVERFLOW_MODEL for a name that never succeeded). The label of a name that never
        succeeded goes with its last request."""
        with self._lock:
            self._in_flight[label] -= 1
            if answered:
                self._running[label] -= 1
            if ok:
                self._confirmed.add(label)
                return label
            if label in self._confirmed or label in self._listed:
                return label
            if self._in_flight[label] == 0:
                del self._in_flight[label]
                self._running.pop(label, None)
            return OVERFLOW_MODEL

    def tokens(self, label: str, prompt: int, generated: int) -> None:
        with self._lock:
            self._prompt[label] = self._prompt.get(label, 0) + prompt
            self._generated[label] = self._generated.get(label, 0) + generated

    def snapshot(self) -> dict[str, tuple[int, int, int, int]]:
        """label -> (running, waiting, prompt tokens, generated tokens), for every label a relayed request made
        (none before the first one: nothing observed is not zero)."""
        with self._lock:
            labels = (set(self._in_flight) - {OVERFLOW_MODEL}) | {
                label for label, count in self._in_flight.items() if count
            }
            out = {}
            for label in labels | set(self._prompt):
                running = self._running.get(label, 0)
                out[label] = (
                    running,
                    self._in_flight.get(label, 0) - running,
                    self._prompt.get(label, 0),
                    self._generated.get(label, 0),
                )
            return out

    def in_flight(self) -> int:
        with self._lock:
            return sum(self._in_flight.values())
