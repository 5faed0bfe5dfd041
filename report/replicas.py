"""The discrete-event model of N replicas behind a router, fed with the latencies one replica's knee measured.

What it assumes (the README's plan section says the same):
- A replica's state is its number of requests in flight, k (prefilling or decoding). The knee measured, at
  each load level, the TTFT and time per output token (TPOT) distributions of one replica with that many
  requests in flight (closed loop: the users; open loop: the mean in flight, sum of E2E over the wall).
- An arriving request is routed at once (no queue in the router): round robin, or least connections
  (nginx's `least_conn`: the replica with the fewest requests, waiting ones included, ties taken in turn).
- Where the replica's batch slots are known (the run recorded the engine's setting, or --slots), a request
  beyond them waits in the replica's queue, first come first served, until one frees; its TTFT is that wait
  plus the TTFT drawn at admission. Without them, every request is admitted at once, and the queueing
  inside the engine is in the TTFT distributions as the knee measured them.
- At admission a request draws its TTFT from the lowest measured level at or above k, the requests then
  running (itself counted). Its decode runs token by token at the TPOT of the level at or above the
  replica's k of the moment, so requests admitted later slow the ones decoding. A request keeps
  one quantile for its whole life (a slow request stays slow as the load changes), and fails with the
  level's measured failure share.
- A load above the highest measured level is not extrapolated: such a request counts as failed ("beyond
  the measured load"), the decode keeps the top level's pace times k / top (for the state only).
- Replicas run on machines of their own, unless they share one (`Sharing`: M replicas a machine, and a second knee
  of one replica measured while its neighbours were kept busy). Then a replica draws from that busy knee whenever
  another replica on its machine has a request in flight, and from its own knee otherwise: two states, not a
  measured curve of how many neighbours are busy.
- No cache is shared across replicas, and the traffic's prompts are taken to be like the knee's.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

ROUND_ROBIN = "round_robin"
LEAST_CONN = "least_conn"
POLICIES = (ROUND_ROBIN, LEAST_CONN)
BEYOND = "beyond the measured load"


@dataclass(frozen=True)
class Level:
    """One measured load level of one replica: the distributions a request in flight with `concurrency` draws from."""

    concurrency: float
    ttft_s: np.ndarray  # sorted, successful requests
    tpot_s: np.ndarray  # sorted, successful requests of more than one token
    failed_share: float
    requests: int
    prefill_ms: float | None = None  # the median prefill as the engine timed it, where it times each request

    def ttft(self, u: float) -> float:
        return float(self.ttft_s[min(int(u * len(self.ttft_s)), len(self.ttft_s) - 1)])

    def tpot(self, u: float) -> float:
        values = self.tpot_s if len(self.tpot_s) else np.zeros(1)
        return float(values[min(int(u * len(values)), len(values) - 1)])

    def scaled(self, ttft: float, tpot: float) -> Level:
        """The same level on a replica whose prefill and decode run `ttft` and `tpot` times as long."""
        prefill = None if self.prefill_ms is None else self.prefill_ms * ttft
        return replace(self, ttft_s=self.ttft_s * ttft, tpot_s=self.tpot_s * tpot, prefill_ms=prefill)


@dataclass(frozen=True)
class Profile:
    """One replica of one engine and setting, as its knee measured it."""

    label: str
    engine: str
    levels: tuple[Level, ...]  # by concurrency, ascending
    knee: float | None  # the knee's load (users) under its SLOs, when it found one
    slots: int | None  # the replica's batch slots (requests beyond them wait in its queue); None: not known
    output_tokens: int  # the knee's median output length: what a traffic without lengths asks for
    prompt_tokens: int | None
    # Measured at the knee's load, not modelled: joules per good output token, or None and why not
    joules_per_good_token: float | None = None
    energy_reason: str = "not measured"

    def __post_init__(self) -> None:
        if not self.levels:
            raise ValueError(f"{self.label}: no measured level to model a replica with")

    @property
    def top(self) -> float:
        return self.levels[-1].concurrency

    def level_for(self, k: int) -> Level | None:
        """The lowest measured level at or above k requests in flight; None above the highest."""
        i = bisect.bisect_left([lv.concurrency for lv in self.levels], k - 1e-9)
        return self.levels[i] if i < len(self.levels) else None

    def scaled(self, ttft: float, tpot: float) -> Profile:
        """The same replica run `ttft` and `tpot` times as slow (a machine whose speed moved since the knee): every
        level's latencies scaled, its failures and loads as measured."""
        return replace(self, levels=tuple(lv.scaled(ttft, tpot) for lv in self.levels))


@dataclass(frozen=True)
class Sharing:
    """Replicas that share a machine slow each other (cores, memory bandwidth): `per_host` replicas a machine, and
    `busy`, one replica's knee measured while the others on its machine were kept busy."""

    per_host: int
    busy: Profile

    def __post_init__(self) -> None:
        if self.per_host < 1:
            raise ValueError("replicas per machine must be at least 1")


@dataclass(frozen=True)
class Arrival:
    at: float  # seconds from the traffic's start
    output_tokens: int | None = None  # None: the profile's


@dataclass
class Outcome:
    """One request's predicted fate."""

    at: float
    replica: int
    ok: bool
    ttft_s: float | None
    e2e_s: float | None
    output_tokens: int
    error: str | None = None


@dataclass
class _Flight:
    index: int
    arrived: float
    first_at: float
    remaining: float  # decode tokens still to come after the first
    u_tpot: float
    beyond: bool
    failed: bool


@dataclass
class _Replica:
    flights: dict[int, _Flight] = field(default_factory=dict)  # admitted: prefilling or decoding
    waiting: deque[int] = field(default_factory=deque)  # arrivals beyond the batch slots, in order
    last: float = 0.0
    version: int = 0

    def pace(self, profile: Profile, f: _Flight) -> float:
        """Seconds per decode token of this flight at the replica's current load."""
        k = len(self.flights)
        level = profile.level_for(k)
        if level is None:
            return profile.levels[-1].tpot(f.u_tpot) * k / profile.top
        return level.tpot(f.u_tpot)

    def advance(self, profile: Profile, now: float) -> None:
        dt = now - self.last
        if dt > 0:
            for f in self.flights.values():
                if f.first_at <= self.last and f.remaining > 0:
                    pace = self.pace(profile, f)
                    f.remaining = max(0.0, f.remaining - dt / pace) if pace > 0 else 0.0
        self.last = now

    def next_event(self, profile: Profile) -> tuple[float, int] | None:
        best: tuple[float, int] | None = None
        for f in self.flights.values():
            if f.first_at > self.last:
                t = f.first_at
            else:
                t = self.last + f.remaining * self.pace(profile, f)
            if best is None or t < best[0]:
                best = (t, f.index)
        return best


def simulate(
    arrivals: Sequence[Arrival],
    profile: Profile,
    replicas: int,
    policy: str = LEAST_CONN,
    seed: int = 0,
    sharing: Sharing | None = None,
) -> list[Outcome]:
    """Every arrival's outcome over `replicas` replicas."""
    if replicas < 1:
        raise ValueError("replicas must be at least 1")
    if policy not in POLICIES:
        raise ValueError(f"routing policy {policy!r}: expected {' or '.join(POLICIES)}")
    rng = random.Random(seed)
    state = [_Replica() for _ in range(replicas)]
    outcomes: list[Outcome | None] = [None] * len(arrivals)
    heap: list[tuple[float, int, int, int]] = []  # (time, replica, its version, flight): stale when versions differ
    turn = itertools.count()
    draws = [(rng.random(), rng.random(), rng.random()) for _ in arrivals]  # one quantile each for the whole life
    per_host = sharing.per_host if sharing else 1

    def machine(r: int) -> range:
        """The replicas whose pace changes when r's load does: r's machine (r alone without sharing)."""
        first = r - r % per_host
        return range(first, min(first + per_host, replicas))

    def of(r: int) -> Profile:
        """The knee replica r draws from now: the busy one while a neighbour on its machine has work."""
        if sharing and any(state[j].flights for j in machine(r) if j != r):
            return sharing.busy
        return profile

    def advance(r: int, now: float) -> None:
        """Bring r's machine to `now` at the paces of the moment, before r's load changes them."""
        for j in machine(r):
            state[j].advance(of(j), now)

    def schedule(r: int) -> None:
        for j in machine(r):
            state[j].version += 1
            nxt = state[j].next_event(of(j))
            if nxt is not None:
                heapq.heappush(heap, (nxt[0], j, state[j].version, nxt[1]))

    def admit(r: int, index: int, now: float) -> None:
        rep, drawn = state[r], of(r)
        a = arrivals[index]
        k = len(rep.flights) + 1
        level = drawn.level_for(k)
        u_ttft, u_tpot, u_fail = draws[index]
        beyond = level is None
        measured = level or drawn.levels[-1]
        ttft = measured.ttft(u_ttft) * (k / drawn.top if beyond else 1.0)
        tokens = a.output_tokens or profile.output_tokens
        failed = u_fail < measured.failed_share
        rep.flights[index] = _Flight(index, a.at, now + ttft, max(0, tokens - 1), u_tpot, beyond, failed)
        outcomes[index] = Outcome(a.at, r, True, now - a.at + ttft, None, tokens)

    def settle(until: float) -> None:
        """Every event up to `until`: first tokens (the pace of the others may change) and completions."""
        while heap and heap[0][0] <= until:
            t, r, version, index = heapq.heappop(heap)
            rep = state[r]
            if version != rep.version:
                continue
            advance(r, t)
            f = rep.flights[index]
            if f.remaining <= 1e-9 and f.first_at <= t:
                del rep.flights[index]
                out = outcomes[index]
                out.e2e_s = t - f.arrived
                out.ok = not (f.beyond or f.failed)
                out.error = BEYOND if f.beyond else ("failed as measured" if f.failed else None)
                if not out.ok:
                    out.ttft_s = out.e2e_s = None
                if rep.waiting:
                    admit(r, rep.waiting.popleft(), t)
            schedule(r)

    for index, a in enumerate(arrivals):
        settle(a.at)
        if policy == ROUND_ROBIN:
            r = index % replicas
        else:
            fewest = min(len(s.flights) + len(s.waiting) for s in state)
            tied = [i for i, s in enumerate(state) if len(s.flights) + len(s.waiting) == fewest]
            r = tied[next(turn) % len(tied)]
        rep = state[r]
        advance(r, a.at)
        if profile.slots is not None and len(rep.flights) >= profile.slots:
            rep.waiting.append(index)
        else:
            admit(r, index, a.at)
        schedule(r)
    settle(float("inf"))
    return [o for o in outcomes if o is not None]
