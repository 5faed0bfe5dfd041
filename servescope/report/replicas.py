"""The discrete-event model of N replicas behind a router, fed with the latencies one replica's knee measured.

What it assumes (the README's plan section says the same):
- A replica's state is its number of requests in flight, k (prefilling or decoding). The knee measured, at
  each load level, the TTFT and time per output token (TPOT) distributions of one replica with that many
  requests in flight (closed loop: the users; open loop: the mean in flight, sum of E2E over the wall).
- An arriving request is routed at once (no queue in the router): round robin, or least connections
  (nginx's `least_conn`: the replica with the fewest requests, waiting ones included, ties taken in turn; the turn
  moves on each tie, from a start each repetition of the model takes in turn, since a router's turn is not known).
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
- Inter-token gaps (for the SLO's ITL terms): a request's gaps are its time per output token in the model times the
  shape the knee measured at the level it was admitted at (each measured gap over its own request's TPOT): its
  tokens - 1 gaps are that shape's evenly spaced quantiles. A slow decode stretches them all; a level whose engine
  stalled a decode now and then (another request's prefill) passes its long gaps on.
- No cache is shared across replicas, and the traffic's prompts are taken to be like the knee's.

The event loop itself is servescope/report/replica_events.py (compiled with numba): `run` takes the arrivals as columns
(`Schedule`) and gives the outcomes as columns (`Outcomes`), what a plan of 2,000,000 arrivals needs; `simulate`
is the same for a handful of arrivals, one object each.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from servescope.contracts.routing import LEAST_CONN, POLICIES, ROUND_ROBIN
from servescope.report import replica_events

if TYPE_CHECKING:  # the router imports this module: the knee's reader stays out of its start-up
    from servescope.report.speed import Spread

BEYOND = "beyond the measured load"
FAILED = "failed as measured"
ERRORS = {replica_events.ERR_BEYOND: BEYOND, replica_events.ERR_FAILED: FAILED}


def _empty() -> np.ndarray:
    return np.zeros(0)


@dataclass(frozen=True)
class Level:
    """One measured load level of one replica: the distributions a request in flight with `concurrency` draws from."""

    concurrency: float
    ttft_s: np.ndarray  # sorted, successful requests (empty: every request failed; they take no time in the model)
    tpot_s: np.ndarray  # sorted, successful requests of more than one token (empty: decode takes no time)
    failed_share: float
    requests: int
    prefill_ms: float | None = None  # the engine's own prefill timing's pace (pace.pace), where it times each request
    itl_shape: np.ndarray = field(default_factory=_empty)  # sorted: each measured gap over its request's TPOT

    def ttft(self, u: float) -> float:
        return _at(self.ttft_s, u)

    def tpot(self, u: float) -> float:
        return _at(self.tpot_s, u)

    def scaled(self, ttft: float, tpot: float) -> Level:
        """The same level on a replica whose prefill and decode run `ttft` and `tpot` times as long (the gaps' shape,
        relative to the decode's pace, stays)."""
        prefill = None if self.prefill_ms is None else self.prefill_ms * ttft
        return replace(self, ttft_s=self.ttft_s * ttft, tpot_s=self.tpot_s * tpot, prefill_ms=prefill)


def _at(values: np.ndarray, u: float) -> float:
    """The value at quantile u of a sorted array, as the event loop reads it (empty: 0)."""
    return float(values[min(int(u * len(values)), len(values) - 1)]) if len(values) else 0.0


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
    # How its knee saw its speed move (servescope/report/speed.py), for the plan's band; None: not read from a knee
    speed: Spread | None = None
    # Measurements of the knee left out of `levels`, as text: a pace its level's other measurements outvoted
    # (servescope/judgements/pace.py); `speed` still counts them
    outvoted: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.levels:
            raise ValueError(f"{self.label}: no measured level to model a replica with")
        loads = [lv.concurrency for lv in self.levels]
        if not all(isinstance(c, (int, float)) and math.isfinite(c) and c > 0 for c in loads):
            raise ValueError(f"{self.label}: a load level must be a number of requests in flight above 0, got {loads}")
        if any(b <= a for a, b in zip(loads, loads[1:], strict=False)):
            raise ValueError(f"{self.label}: load levels must rise, got {loads}")
        for lv in self.levels:
            for name, values in (("TTFT", lv.ttft_s), ("time per token", lv.tpot_s), ("ITL shape", lv.itl_shape)):
                if len(values) and not (np.all(np.isfinite(values)) and values.min() >= 0):
                    raise ValueError(f"{self.label}: level {lv.concurrency:g}: a {name} that is not seconds >= 0")
            if not 0 <= lv.failed_share <= 1:
                raise ValueError(f"{self.label}: level {lv.concurrency:g}: failed share {lv.failed_share} not in 0-1")
        if self.slots is not None and (isinstance(self.slots, bool) or self.slots < 1):
            raise ValueError(f"{self.label}: {self.slots} batch slots: a replica needs at least 1 (--slots)")
        if self.output_tokens < 1:
            raise ValueError(f"{self.label}: {self.output_tokens} output tokens: at least 1")

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

    @property
    def measured_tpot(self) -> bool:
        """Whether any level measured a time per output token (a knee of one-token answers did not)."""
        return any(len(lv.tpot_s) for lv in self.levels)

    @property
    def measured_itl(self) -> bool:
        """Whether any level measured inter-token gaps (the shape the model's ITL is made of)."""
        return any(len(lv.itl_shape) for lv in self.levels)


@dataclass(frozen=True)
class Sharing:
    """Replicas that share a machine slow each other (cores, memory bandwidth): `per_host` replicas a machine, and
    `busy`, one replica's knee measured while the others on its machine were kept busy."""

    per_host: int
    busy: Profile

    def __post_init__(self) -> None:
        if isinstance(self.per_host, bool) or self.per_host < 1:
            raise ValueError("replicas per machine must be at least 1")


@dataclass(frozen=True, slots=True)  # slots: a fleet's traffic is millions of these
class Arrival:
    """One request of a traffic: when it arrives, and the output length it asks for."""

    at: float  # seconds from the traffic's start
    output_tokens: int | None = None  # None: the profile's


@dataclass(frozen=True)
class Schedule:
    """Arrivals as columns, what the event loop reads: times (ascending) and output lengths (0: the profile's)."""

    at: np.ndarray
    output_tokens: np.ndarray

    @staticmethod
    def of(arrivals: Sequence[Arrival]) -> Schedule:
        n = len(arrivals)
        at = np.fromiter((a.at for a in arrivals), np.float64, n)
        tokens = np.fromiter((a.output_tokens or 0 for a in arrivals), np.int64, n)
        return Schedule(at, tokens)

    def __len__(self) -> int:
        return len(self.at)

    def check(self) -> None:
        """ValueError (one line) on times the loop cannot run: not finite, negative or out of order."""
        if len(self.at) and not (np.all(np.isfinite(self.at)) and self.at[0] >= 0 and np.all(np.diff(self.at) >= 0)):
            raise ValueError("arrival times must be finite seconds from 0, in order")
        if np.any(self.output_tokens < 0):
            raise ValueError("an arrival's output tokens must be at least 0 (0: the knee's)")


@dataclass(frozen=True)
class Outcomes:
    """Every arrival's predicted fate, as columns (the order of the arrivals)."""

    at: np.ndarray
    replica: np.ndarray
    ok: np.ndarray
    ttft_s: np.ndarray  # NaN where it failed
    e2e_s: np.ndarray  # NaN where it failed
    output_tokens: np.ndarray
    error: np.ndarray  # 0, replica_events.ERR_BEYOND or ERR_FAILED
    level: np.ndarray  # which level it was admitted at: the own knee's from 0, the busy knee's after them

    def __len__(self) -> int:
        return len(self.at)


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


def _pack(profile: Profile) -> tuple[np.ndarray, ...]:
    """A profile's levels as the event loop reads them: loads, TTFT and TPOT values flattened with their offsets,
    failure shares."""

    def flat(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        offsets = np.zeros(len(arrays) + 1, np.int64)
        offsets[1:] = np.cumsum([len(a) for a in arrays])
        values = np.concatenate([np.asarray(a, np.float64) for a in arrays]) if arrays else np.zeros(0)
        return offsets, np.ascontiguousarray(values, np.float64)

    conc = np.array([lv.concurrency for lv in profile.levels], np.float64)
    ttft_off, ttft_val = flat([lv.ttft_s for lv in profile.levels])
    tpot_off, tpot_val = flat([lv.tpot_s for lv in profile.levels])
    failed = np.array([lv.failed_share for lv in profile.levels], np.float64)
    return conc, ttft_off, ttft_val, tpot_off, tpot_val, failed


def draws(seed: int, n: int) -> np.ndarray:
    """n rows of three quantiles (TTFT, time per token, failure), one row a request for its whole life: the stream
    `random.Random(seed)` gives, read at numpy's speed."""
    state = random.Random(seed).getstate()[1]
    rng = np.random.RandomState()
    rng.set_state(("MT19937", np.array(state[:624], np.uint32), state[624]))
    return rng.random_sample(3 * n).reshape(n, 3)


def run(
    schedule: Schedule,
    profile: Profile,
    replicas: int,
    policy: str = LEAST_CONN,
    seed: int = 0,
    sharing: Sharing | None = None,
) -> Outcomes:
    """Every arrival's outcome over `replicas` replicas, as columns. A replica at another speed is the same call with
    `profile.scaled(...)` (and the busy knee's too)."""
    if isinstance(replicas, bool) or not isinstance(replicas, (int, np.integer)) or replicas < 1:
        raise ValueError("replicas must be at least 1")
    if policy not in POLICIES:
        raise ValueError(f"routing policy {policy!r}: expected {' or '.join(POLICIES)}")
    schedule.check()
    tokens = np.where(schedule.output_tokens > 0, schedule.output_tokens, profile.output_tokens).astype(np.int64)
    u = draws(seed, len(schedule))
    own = _pack(profile)
    busy = _pack(sharing.busy) if sharing else own
    rep, ttft, e2e, err, level = replica_events.run(
        np.ascontiguousarray(schedule.at, np.float64),
        tokens,
        u,
        int(replicas),
        policy == ROUND_ROBIN,
        int(seed),  # the router's turn among tied replicas at the start is not known: each repetition its own
        -1 if profile.slots is None else int(profile.slots),
        sharing.per_host if sharing else 1,
        sharing is not None,
        *own,
        *busy,
    )
    return Outcomes(schedule.at, rep, err == replica_events.OK, ttft, e2e, tokens, err, level)


def warm() -> None:
    """Compile the event loop now (or load it from numba's cache): a plan does so before it builds a traffic of
    millions, so the compiler's memory is not on top of the arrivals'."""
    level = Level(1.0, np.array([0.1]), np.array([0.01]), 0.0, 1)
    run(Schedule(np.zeros(1), np.zeros(1, np.int64)), Profile("warm", "", (level,), None, None, 2, None), 1)


def shapes(profile: Profile, sharing: Sharing | None = None) -> list[np.ndarray]:
    """The ITL shape of each level an outcome's `level` numbers: the own knee's, then the busy knee's."""
    busy = sharing.busy.levels if sharing else ()
    return [lv.itl_shape for lv in (*profile.levels, *busy)]


def simulate(
    arrivals: Sequence[Arrival],
    profile: Profile,
    replicas: int,
    policy: str = LEAST_CONN,
    seed: int = 0,
    sharing: Sharing | None = None,
) -> list[Outcome]:
    """Every arrival's outcome over `replicas` replicas, one object each (`run` for many)."""
    out = run(Schedule.of(arrivals), profile, replicas, policy, seed, sharing)
    return [
        Outcome(
            float(out.at[i]),
            int(out.replica[i]),
            bool(out.ok[i]),
            None if math.isnan(out.ttft_s[i]) else float(out.ttft_s[i]),
            None if math.isnan(out.e2e_s[i]) else float(out.e2e_s[i]),
            int(out.output_tokens[i]),
            ERRORS.get(int(out.error[i])),
        )
        for i in range(len(out))
    ]
