"""Which resource ran out at a load, each name from evidence of its own, and the engine knob that adds more of it.

One rule, read by the knee (loadgen/knee.py), `make tune` (servescope/stack/tune.py) and the report's verdict
(servescope/report/verdict.py, through `queue_resource`). At the lowest load that failed the SLOs, in this order:

  engine fault      the engine was not there: a share of requests refused, timed out or cut, or the exporter
                    could not read the engine for a second or more (down, restarted, frozen). Not a capacity.
  client            the load generator could not keep up: its thread busy (CPU plus the time it waited, ready,
                    for a core) nearly the whole phase, or an open loop's sends late behind their schedule.
  SLO below floor   the load was one request at a time (1 user; an open loop's lowest rate with requests that
                    never overlapped) and the SLOs still failed: no load meets them on this engine here.
  batch slots       requests waited while the KV pool had room (the reference page's section 4), or the engine queues
  KV capacity       only for slots (llama.cpp, Ollama); requests waited with the pool full, or vLLM preempted
                    running requests to free KV blocks.
  compute           nothing waited, the latency the SLOs failed on grew with the running batch from the
                    lightest load measured, AND the engine used nearly the cores it may: every request was
                    admitted and each step took longer. No serving knob buys more of that.
  undecided         anything else, with the numbers: the KV pool between the thresholds (neither lever is
                    claimed, as the verdict and the alert rules say), a latency that grew while the engine's CPU
                    was not measured or had room, no server samples.

The thresholds are servescope/contracts/thresholds.py's; every Binding carries the numbers its name rests on.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from servescope import engines
from servescope.contracts import series, thresholds
from servescope.contracts.runfolder import RequestRecord, SampleRecord
from servescope.engines.base import BATCH_SLOTS, KV_CAPACITY, Lever
from servescope.judgements import slo
from servescope.prometheus.sampler import ENGINE_UNREAD

COMPUTE = "compute"
CLIENT = "client"
SLO_FLOOR = "SLO below the floor"
ENGINE_FAULT = "engine fault"
UNDECIDED = "undecided"
UNKNOWN = UNDECIDED  # knee.json of runs before the evidence rule said "unknown" for the same
RESOURCES = (BATCH_SLOTS, KV_CAPACITY, COMPUTE, CLIENT, SLO_FLOOR, ENGINE_FAULT, UNDECIDED)
# Names that are not a resource a knob adds: a tune stops at them, a knee level with a fault is measured again.
NOT_CAPACITY = (ENGINE_FAULT, CLIENT, UNDECIDED, "unknown")
# What a knee search that stopped on measurements of these (not of the engine's capacity) ends with.
STOPPED = {ENGINE_FAULT: "engine fault", CLIENT: "client bound"}

# What a request that found no engine ends with (loadgen.client.ErrorKind values).
FAULT_KINDS = frozenset({"connection_refused", "timeout", "stream_cut"})


ADVICE = {
    COMPUTE: "no serving knob adds more (fewer or shorter requests, more cores, a smaller model)",
    CLIENT: "the load generator, not the engine: give it a core of its own or more worker processes (--workers), "
    "then measure again",
    SLO_FLOOR: "no load meets these SLOs on this engine here: loosen the term that fails alone, or a faster engine "
    "or machine",
    ENGINE_FAULT: "not a capacity measurement: the engine was down, restarting or frozen at this load",
    UNDECIDED: "no knob is named without evidence",
}


def knob_for(engine: str, resource: str) -> Lever | None:
    """The engine's knob for a resource (its adapter's lever); None where no serving knob adds it (compute, client,
    ...) or the engine kind is unknown."""
    adapter = engines.ENGINES.get(engine)
    return adapter.lever(resource) if adapter is not None else None


@dataclass
class Level:
    """One load level as the rule reads it: every trusted measurement of it, pooled."""

    level: float  # users (closed loop) or arrivals per second (open loop)
    records: list[RequestRecord]
    samples: list[SampleRecord] = field(default_factory=list)  # this engine's server samples during it
    noise: list[dict] = field(
        default_factory=list
    )  # each measurement's PhaseRecord.noise (servescope/host/hostnoise.py)
    result: slo.SloResult | None = None  # the level's pooled SLO verdict


@dataclass
class Binding:
    """The resource that ran out at one load level, with the numbers it was read from."""

    resource: str  # one of RESOURCES
    evidence: str  # the numbers it was read from, in words
    samples: int = 0  # readable samples of the level
    waiting_share: float | None = None  # share of them that saw a request waiting
    peak_waiting: float | None = None
    peak_running: float | None = None
    at_ceiling_while_waiting: float | None = None  # share of the waiting samples with running at its peak
    mean_running: float | None = None
    kv_max_while_waiting: float | None = None
    kv_mean_while_waiting: float | None = None
    kv_peak: float | None = None
    preemptions: float | None = None  # vLLM's counter's growth over the level
    metric: str | None = None  # the latency compared across levels (the SLO term that failed most)
    growth: float | None = None  # its median at this level / at the lightest level measured
    engine_cores: float | None = None
    engine_allowed_cores: float | None = None
    engine_available_cores: float | None = None  # allowed, less what the rest of the machine took meanwhile
    client_busy: float | None = None  # the load generator's busiest measurement: (CPU + run-queue wait) / its cap
    schedule_lag_p99_s: float | None = None
    fault_share: float | None = None
    unread_s: float | None = None

    def to_json(self) -> dict:
        return asdict(self)

    def advice(self, engine: str, current: str | None = None) -> str:
        """The binding resource and what to turn, in one line."""
        knob = knob_for(engine, self.resource)
        if knob is None:
            return f"{self.resource}: {ADVICE.get(self.resource, f'no knob rule for {engine}')}"
        now = f" (now {current})" if current not in (None, "") else ""
        where = f", knob {knob.env}" if knob.env else ""  # an engine servescope does not start has no knob of its own
        return f"{self.resource}: {knob.advice} - {knob.flag}{where}{now}"


# ------------------------------------------------------- the queue: slots or KV (the reference page's section 4)


def queue_resource(engine: str, kv_max_while_waiting: float | None, kv_mean_while_waiting: float | None) -> str:
    """What requests waited for, from the KV pool while they waited: BATCH_SLOTS, KV_CAPACITY or UNDECIDED.

    The verdict reads the same: pool full -> KV; room -> slots; between the thresholds or unknown -> neither
    is claimed (an engine whose queue is only ever for a slot: slots)."""
    if _queue_means_slots(engine):
        return BATCH_SLOTS
    pool = thresholds.kv_pool_state(kv_max_while_waiting, kv_mean_while_waiting)
    return {"full": KV_CAPACITY, "room": BATCH_SLOTS}.get(pool, UNDECIDED)


# ---------------------------------------------------------------- the rule


def classify(
    failing: Level,
    below: Level | None = None,
    *,
    engine: str,
    spec: slo.SloSpec | None = None,
    open_loop: bool = False,
    lowest: bool = False,
) -> Binding:
    """The binding resource at `failing` (the lowest level that failed), `below` the lightest level measured under
    it (what compute's growth is read against), `lowest` when `failing` is the least load the search may try."""
    b = _gauges(failing.samples)
    b.mean_running = _mean_running(failing, open_loop)
    for step in (_fault, _client, _floor, _queue, _compute):
        if step(b, failing, below, engine, spec, open_loop, lowest):
            return b
    return b


def _fault(b: Binding, failing: Level, below, engine, spec, open_loop, lowest) -> bool:
    n = len(failing.records)
    faults = [r for r in failing.records if not r.ok and r.error_kind in FAULT_KINDS]
    b.fault_share = len(faults) / n if n else None
    b.unread_s = unread_s(failing.samples)
    parts = []
    if n and b.fault_share >= thresholds.FAULT_FAILED_SHARE:
        kinds = ", ".join(f"{k} {c}" for k, c in _counts(r.error_kind for r in faults))
        parts.append(f"{len(faults)} of {n} requests found no engine ({kinds})")
    if b.unread_s >= thresholds.FAULT_UNREAD_S:
        parts.append(f"the exporter could not read the engine for {b.unread_s:.1f} s of it")
    if not parts:
        return False
    b.resource, b.evidence = ENGINE_FAULT, "; ".join(parts)
    return True


def _client(b: Binding, failing: Level, below, engine, spec, open_loop, lowest) -> bool:
    busy = [x for x in map(client_busy, failing.noise) if x is not None]
    b.client_busy = max(busy) if busy else None
    lags = sorted(slo.schedule_lag(r) for r in failing.records if r.scheduled_at is not None)
    b.schedule_lag_p99_s = lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else None
    waits = [n["loadgen_wait_cores"] for n in failing.noise if _number(n.get("loadgen_wait_cores"))]
    parts = []
    starved = bool(waits) and max(waits) >= thresholds.CLIENT_WAIT_SHARE
    if b.client_busy is not None and (b.client_busy >= thresholds.CLIENT_BUSY_SHARE or starved):
        worst = next(x for x in failing.noise if client_busy(x) == b.client_busy)
        parts.append(
            f"the load generator was busy {b.client_busy:.0%} of the phase (CPU {worst.get('loadgen_cores', 0):.2f} "
            f"cores, waiting for a core {worst.get('loadgen_wait_cores') or 0:.2f}"
            + (f": it waited, ready to run, >= {thresholds.CLIENT_WAIT_SHARE:.0%} of the time)" if starved else ")")
        )
    if open_loop and b.schedule_lag_p99_s is not None and b.schedule_lag_p99_s > thresholds.SCHEDULE_LAG_P99_MAX_S:
        parts.append(
            f"its sends came up to {b.schedule_lag_p99_s * 1000:.0f} ms (p99) behind their schedule "
            f"(> {thresholds.SCHEDULE_LAG_P99_MAX_S * 1000:.0f} ms)"
        )
    if not parts:
        return False
    b.resource, b.evidence = CLIENT, "; ".join(parts)
    return True


def unread_s(samples: Sequence[SampleRecord]) -> float:
    """Seconds the exporter could not read the engine: from each such read to the next read (a frozen engine makes
    each read wait out the exporter's timeout, so the reads come further apart than the interval asked for)."""
    ordered = sorted(samples, key=lambda s: s.t)
    total = 0.0
    for i, s in enumerate(ordered):
        if s.missing == ENGINE_UNREAD:
            total += (ordered[i + 1].t - s.t) if i + 1 < len(ordered) else s.interval_s
    return total


def cores_left(noise: dict) -> float | None:
    """The cores the engine could have used in a phase: its allowed cores (affinity, cgroup quota), less what every
    other program, servescope's observers and the load generator took of the machine's cores meanwhile."""
    allowed = noise.get("engine_allowed_cores") or noise.get("cores")
    machine = noise.get("cores")
    if not _number(allowed) or not _number(machine):
        return None
    taken = sum(
        noise.get(k) or 0.0 for k in ("foreign_cores", "observer_cores", "loadgen_cores") if _number(noise.get(k))
    )
    return max(0.0, min(float(allowed), float(machine) - taken))


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def client_busy(noise: dict | None) -> float | None:
    """The load generator's (CPU + run-queue wait) over what one Python thread can use in that phase (at most a core,
    less when its affinity or cgroup allows less); None when the phase did not measure it."""
    if not isinstance(noise, dict) or not isinstance(noise.get("loadgen_cores"), int | float):
        return None
    wait = noise.get("loadgen_wait_cores")
    if not isinstance(wait, int | float):
        return None
    allowed = noise.get("loadgen_allowed_cores")
    cap = min(1.0, float(allowed)) if isinstance(allowed, int | float) and allowed > 0 else 1.0
    return (noise["loadgen_cores"] + wait) / cap


def _floor(b: Binding, failing: Level, below, engine, spec, open_loop, lowest) -> bool:
    if not lowest or failing.result is None or failing.result.meets:
        return False  # a load that met the SLOs is no floor, whatever its level
    if open_loop:
        overlap = overlap_share(failing.records)
        if overlap is None or overlap > thresholds.ALONE_OVERLAP_SHARE:
            return False
        alone = f"at {failing.level:g} req/s ({overlap:.0%} of requests overlapped another)"
    else:
        if failing.level != 1:
            return False
        alone = "at 1 user (one request at a time)"
    term = _worst_term(failing.result)
    seen = f"{term.term} met by {term.met_share:.0%}" if term and term.met_share is not None else "the SLOs failed"
    observed = f", observed {term.observed:.3g} s" if term and term.observed is not None else ""
    b.resource, b.evidence = SLO_FLOOR, f"{seen}{observed} {alone}: a request alone misses it"
    return True


def _queue_means_slots(engine: str) -> bool:
    adapter = engines.ENGINES.get(engine)
    return adapter is not None and adapter.queue_means_slots


def _queue(b: Binding, failing: Level, below, engine, spec, open_loop, lowest) -> bool:
    adapter = engines.ENGINES.get(engine)
    if adapter is not None and adapter.held_s is not None:
        return _held(b, failing, adapter)
    waited = b.waiting_share is not None and b.waiting_share >= thresholds.BINDING_WAITING_SHARE
    preempted = b.preemptions is not None and b.preemptions > 0
    if not (waited or preempted):
        return False
    seen = f"waiting > 0 in {round(b.waiting_share * b.samples)} of {b.samples} samples (peak {b.peak_waiting:g})"
    run = f", running peaked at {b.peak_running:g}" if b.peak_running is not None else ""
    if preempted:
        b.resource = KV_CAPACITY
        b.evidence = f"the engine preempted {b.preemptions:g} running requests to free KV blocks; {seen}{run}"
        return True
    resource = queue_resource(engine, b.kv_max_while_waiting, b.kv_mean_while_waiting)
    b.resource = resource
    if resource == KV_CAPACITY:
        b.evidence = (
            f"requests waited on the KV pool: {seen}, KV usage while they waited mean "
            f"{b.kv_mean_while_waiting:.0%}, highest {b.kv_max_while_waiting:.0%}"
        )
    elif resource == BATCH_SLOTS and _queue_means_slots(engine):
        b.evidence = f"requests waited for a slot: {seen}{run}; {engine} queues only for a slot"
    elif resource == BATCH_SLOTS and (
        b.at_ceiling_while_waiting is not None and b.at_ceiling_while_waiting < thresholds.SLOT_CEILING_SHARE
    ):
        b.resource = UNDECIDED
        b.evidence = (
            f"requests waited ({seen}{run}) while the running batch was below its peak in "
            f"{1 - b.at_ceiling_while_waiting:.0%} of those samples, KV usage below {thresholds.KV_ROOM:.0%} "
            f"(highest {b.kv_max_while_waiting:.0%}): the scheduler admitted them at its own pace, not for want of "
            f"a slot or KV: neither is claimed"
        )
    elif resource == BATCH_SLOTS:
        b.evidence = (
            f"requests waited for a slot: {seen}{run}; KV usage stayed below {thresholds.KV_ROOM:.0%} "
            f"(highest {b.kv_max_while_waiting:.0%})"
        )
    elif b.kv_max_while_waiting is None:
        b.evidence = f"requests waited ({seen}{run}) but the KV pool's usage is unknown: slots or KV not told apart"
    else:
        b.evidence = (
            f"requests waited ({seen}{run}) with the KV pool between {thresholds.KV_ROOM:.0%} and "
            f"{thresholds.KV_FULL:.0%} (mean {b.kv_mean_while_waiting:.0%}, highest {b.kv_max_while_waiting:.0%}): "
            f"neither slots nor KV is claimed"
        )
    return True


def _held(b: Binding, failing: Level, adapter: engines.EngineKind) -> bool:
    """An engine whose own durations say how long it held a request (Ollama: its proxy's waiting count holds prompt
    evaluation and model loads too): a request it held outside the model for TTFT_QUEUED_MIN_S or more waited for a
    slot."""
    held = [h for h in (adapter.held_s(r.engine_stats or {}) for r in failing.records if r.ok) if h is not None]
    if not held:
        return False  # no durations (the OpenAI API carries none): compute's evidence, else undecided
    waited = [h for h in held if h >= thresholds.TTFT_QUEUED_MIN_S]
    if len(waited) / len(held) < thresholds.BINDING_WAITING_SHARE:
        return False
    b.resource = BATCH_SLOTS
    slots = adapter.lever(BATCH_SLOTS)
    slot = f"one of {slots.env}'s slots" if slots and slots.env else "a slot"
    b.evidence = (
        f"{adapter.title} held {len(waited)} of {len(held)} requests outside the model for "
        f"{thresholds.TTFT_QUEUED_MIN_S * 1000:g} ms or more (its own durations; longest {max(held):.2f} s): they "
        f"waited for {slot}"
    )
    return True


def _compute(b: Binding, failing: Level, below, engine, spec, open_loop, lowest) -> bool:
    queued = (
        f"nothing queued (waiting > 0 in {round((b.waiting_share or 0) * b.samples)} of {b.samples} samples)"
        if b.samples
        else "no server samples (no gauges: slots and KV cannot be told apart)"
    )
    b.metric, b.growth, grew = _growth(failing, below, spec, open_loop)
    measured = [n for n in failing.noise if isinstance(n.get("engine_cores"), int | float)]
    b.engine_cores = statistics.fmean(n["engine_cores"] for n in measured) if measured else None
    allowed = [a for a in (n.get("engine_allowed_cores") or n.get("cores") for n in measured) if _number(a)]
    b.engine_allowed_cores = max(allowed) if allowed else None
    left = [x for x in map(cores_left, measured) if x is not None]
    b.engine_available_cores = statistics.fmean(left) if left else b.engine_allowed_cores
    cpu_measured = b.engine_cores is not None and bool(b.engine_available_cores)
    squeezed = cpu_measured and b.engine_available_cores < thresholds.ENGINE_CORES_LEFT_MIN
    if not cpu_measured:
        cpu, busy = "the engine's CPU was not measured (not on this host?)", False
    else:
        busy = not squeezed and b.engine_cores >= thresholds.ENGINE_CPU_NEAR * b.engine_available_cores
        others = (
            f" ({b.engine_allowed_cores:g} allowed, the rest used by other programs)"
            if b.engine_allowed_cores and b.engine_available_cores < b.engine_allowed_cores - 0.005
            else ""
        )
        cpu = f"the engine used {b.engine_cores:.2f} of the {b.engine_available_cores:.2f} cores it could have{others}"
    rising = b.growth is not None and b.growth >= thresholds.COMPUTE_GROWTH
    if b.samples and rising and busy:
        b.resource = COMPUTE
        b.evidence = f"{queued}; {grew}; {cpu}: every request was admitted and each step took longer"
        return True
    b.resource = UNDECIDED
    missing = []
    if not b.samples:
        missing.append("no server samples")
    if not rising:
        missing.append(
            f"{b.metric or 'latency'} did not grow {thresholds.COMPUTE_GROWTH:g}x with the batch"
            if b.growth is not None
            else "no level below to compare with"
        )
    if not busy:
        missing.append(
            "CPU not measured"
            if not cpu_measured
            else f"other programs left the engine under {thresholds.ENGINE_CORES_LEFT_MIN:g} cores"
            if squeezed
            else f"the engine's CPU below {thresholds.ENGINE_CPU_NEAR:.0%} of the cores it could have"
        )
    b.evidence = f"{queued}; {grew or 'no latency compared'}; {cpu} ({', '.join(missing)}: compute not claimed)"
    return True


# ---------------------------------------------------------------- the numbers


def _gauges(samples: Sequence[SampleRecord]) -> Binding:
    readable = [s for s in samples if not s.missing and series.REQUESTS_WAITING in s.values]
    b = Binding(UNDECIDED, "", samples=len(readable))
    if not readable:
        return b
    waiting = [s.values[series.REQUESTS_WAITING] for s in readable]
    running = [s.values[series.REQUESTS_RUNNING] for s in readable if series.REQUESTS_RUNNING in s.values]
    kv_all = [s.values[series.KV_CACHE_USAGE] for s in readable if series.KV_CACHE_USAGE in s.values]
    waited = [s for s in readable if s.values[series.REQUESTS_WAITING] > 0]
    kv_waiting = [s.values[series.KV_CACHE_USAGE] for s in waited if series.KV_CACHE_USAGE in s.values]
    pre = [(s.t, s.values[series.PREEMPTIONS]) for s in readable if series.PREEMPTIONS in s.values]
    b.waiting_share = len(waited) / len(readable)
    b.peak_waiting = max(waiting)
    b.peak_running = max(running) if running else None
    ceiling = [
        s.values[series.REQUESTS_RUNNING] >= b.peak_running for s in waited if series.REQUESTS_RUNNING in s.values
    ]
    b.at_ceiling_while_waiting = sum(ceiling) / len(ceiling) if ceiling else None
    b.kv_max_while_waiting = max(kv_waiting) if kv_waiting else None
    b.kv_mean_while_waiting = statistics.fmean(kv_waiting) if kv_waiting else None
    b.kv_peak = max(kv_all) if kv_all else None
    if len(pre) >= 2:
        growth = max(pre)[1] - min(pre)[1]
        b.preemptions = growth if growth >= 0 else None  # a restart began the counter again
    return b


def _mean_running(level: Level, open_loop: bool) -> float | None:
    """The running batch at a level: the engine's gauge, else the users (closed loop) or requests in flight."""
    running = [
        s.values[series.REQUESTS_RUNNING]
        for s in level.samples
        if not s.missing and series.REQUESTS_RUNNING in s.values
    ]
    if running:
        return statistics.fmean(running)
    if not open_loop:
        return float(level.level)
    return in_flight(level.records)


def in_flight(records: Sequence[RequestRecord]) -> float | None:
    """Requests in flight on average (client side): their summed time over the span they cover (Little's law)."""
    spans = [(r.started_at, slo.finished_at(r)) for r in records if r.e2e_s is not None]
    if not spans:
        return None
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    return sum(e - s for s, e in spans) / wall if wall > 0 else None


def overlap_share(records: Sequence[RequestRecord]) -> float | None:
    """The share of requests that were in flight while another one was (client side)."""
    spans = sorted((r.started_at, slo.finished_at(r)) for r in records if r.e2e_s is not None)
    if not spans:
        return None
    overlapped = set()
    end_so_far, owner = spans[0][1], 0
    for i in range(1, len(spans)):
        start, end = spans[i]
        if start < end_so_far:
            overlapped.update((i, owner))
        if end > end_so_far:
            end_so_far, owner = end, i
    return len(overlapped) / len(spans)


def _growth(
    failing: Level, below: Level | None, spec: slo.SloSpec | None, open_loop: bool
) -> tuple[str | None, float | None, str]:
    """(metric, its median at `failing` / at `below`, the words) for the term the SLOs failed on most."""
    if below is None or below.level == failing.level:
        return None, None, ""
    term = _failed_term(failing.result, spec)
    metrics = [term.metric] if term is not None else ["ttft", "tpot"]
    best: tuple[str | None, float | None, str] = (None, None, "")
    for metric in metrics:
        probe = slo.Term(metric, 1.0, 50.0 if metric == "itl" else None)
        high, low = _median(probe, failing.records), _median(probe, below.records)
        if high is None or low is None or low <= 0:
            continue
        ratio = high / low
        if best[1] is None or ratio > best[1]:
            run_low, run_high = _mean_running(below, open_loop), _mean_running(failing, open_loop)
            batch = (
                f" while the running batch went {run_low:.1f} -> {run_high:.1f}"
                if run_low is not None and run_high is not None
                else ""
            )
            if run_low is not None and run_high is not None and run_high <= run_low * 1.1:
                batch = f" with the running batch flat at {run_high:.1f}"
                ratio = min(ratio, 1.0)  # a latency that grew without a bigger batch is not the batch's cost
            best = (
                metric,
                ratio,
                f"{metric} median {low:.3g} s at {below.level:g} -> {high:.3g} s at {failing.level:g} "
                f"(x{high / low:.2f}){batch}",
            )
    return best


def _median(term: slo.Term, records: Iterable[RequestRecord]) -> float | None:
    values = [v for v in (term.request_value(r) for r in records if r.ok) if v is not None]
    return statistics.median(values) if values else None


def _failed_term(result: slo.SloResult | None, spec: slo.SloSpec | None) -> slo.Term | None:
    if result is None or spec is None or not result.failed_most:
        return None
    return next((t for t in spec.terms if t.name == result.failed_most), None)


def _worst_term(result: slo.SloResult | None) -> slo.TermResult | None:
    if result is None or not result.terms:
        return None
    held = [t for t in result.terms if t.met_share is not None]
    return min(held, key=lambda t: t.met_share) if held else None


def _counts(values: Iterable[str | None]) -> list[tuple[str, int]]:
    out: dict[str, int] = {}
    for v in values:
        out[v or "?"] = out.get(v or "?", 0) + 1
    return sorted(out.items(), key=lambda kv: -kv[1])
