"""Which knob to move: the reference page's section 4 on the gauges, weighed with what clients and engine timings saw; plus section 3.

The gauges (the run's own samples, else Prometheus) say whether requests waited and how full the
KV pool was while they did (servescope/contracts/thresholds.py, the table the alert rules are generated
from). The clients say it too: in a burst, first tokens that came one after another, later ones
only once an earlier request had finished (sweep.queueing). The engine's timings give a queue
share of TTFT (servescope/report/ttft_split.py). When these disagree the verdict says so and why, and it
never reports that nothing waited while the clients saw requests served one after another.

Ollama reports no queue of its own. Its running / waiting are what the exporter's proxy observed of
the requests it relayed (source="proxy": waiting counts a request until the first chunk of its
answer, queued, loading or evaluating its prompt alike), so they never decide alone: its verdict
rests on Ollama's own durations in each final object (the time it held a request outside load,
prompt evaluation and generation), then on TTFT by arrival order in the bursts, and says so when it
has nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from servescope import engines
from servescope.contracts import series, thresholds
from servescope.engines.base import Lever
from servescope.judgements import binding
from servescope.judgements.kv_arithmetic import blocks_for, capacity_tokens, max_concurrency
from servescope.report.gauges import EngineGauges, GaugeReport
from servescope.report.load import EngineInfo, Run
from servescope.report.noise import Assessment, worst_slowdown
from servescope.report.sweep import BurstDrain
from servescope.report.ttft_split import TtftSplit
from servescope.text import numbers, words

KV_FULL, KV_ROOM = thresholds.KV_FULL, thresholds.KV_ROOM
RULE_KV = (
    f"KV usage that stayed below {KV_ROOM:.0%} -> the batch slots were the limit ({{slots}}); KV usage averaging "
    f"{KV_FULL:.0%} or more -> the KV pool was the limit ({{pool}}); in between, neither is claimed"
)
RULE_WEIGHED = (
    "The clients' TTFT by arrival order and the engine's own queue timings are weighed with the gauges: a queue any of "
    "them saw is a queue (the thresholds are the alert rules' too: servescope/contracts/thresholds.py)."
)
RULE_DURATIONS = (
    "{title} has no queue gauge: the proxy's running/waiting (waiting = no first chunk yet: queued, loading or "
    "evaluating the prompt) never decide alone; its own durations do (a request held "
    f"{thresholds.TTFT_QUEUED_MIN_S * 1000:g} ms or more outside load, prompt evaluation and generation waited: "
    "{slots}), else the bursts' TTFT by arrival (a first token only after another request had finished), else "
    "undetermined."
)


def rule(kinds: Sequence[str] | None = None) -> str:
    """The verdict's rule in words for the engine kinds that ran (every kind servescope knows when None): the reference
    page's section 4 on the gauges, each engine's levers, and what else is weighed."""
    known = engines.ENGINES
    chosen = [known[k] for k in dict.fromkeys(kinds if kinds is not None else known) if k in known]
    said = []
    for adapter in chosen:
        slots, pool = adapter.lever(binding.BATCH_SLOTS), adapter.lever(binding.KV_CAPACITY)
        if slots is None:
            continue
        if adapter.held_s is not None:
            said.append(RULE_DURATIONS.format(title=adapter.title, slots=slots.say()))
        elif adapter.queue_means_slots or pool is None:
            said.append(f"{adapter.title}: its queue is only ever for a slot: requests waiting -> {slots.say()}.")
        else:
            kv = pool.say() + (f"; {pool.caveat}" if pool.caveat else "")
            said.append(f"{adapter.title}: {RULE_KV.format(slots=slots.say(), pool=kv)}.")
    head = "The reference page's section 4, read from the gauges while requests waited."
    return " ".join([head, *said, RULE_WEIGHED])


RUNNING, WAITING, KV_USAGE = series.REQUESTS_RUNNING, series.REQUESTS_WAITING, series.KV_CACHE_USAGE


@dataclass
class Verdict:
    """One engine instance's answer to which knob to move: the lever, its evidence, and what it left out."""

    instance: str
    engine: str
    computable: bool
    lever: str | None  # max_num_seqs, kv_cache_space_or_max_model_len, kv_undecided, llamacpp_parallel,
    #                    ollama_num_parallel, undetermined, none; None when no verdict could be made
    text: str
    evidence: str = ""
    disagreement: str = ""  # when the gauges, the clients and the engine's timings tell different stories: why
    left_out: list[str] = field(default_factory=list)  # flagged phases it did not conclude from: rerun them
    busy: str = ""  # the phases it concluded from that were measured on a busy host, said beside it
    peak_running: float | None = None
    peak_waiting: float | None = None
    peak_kv_usage: float | None = None


@dataclass
class KvArithmetic:
    """One engine instance's KV cache arithmetic: capacity in blocks and tokens, and what a burst needs of it."""

    instance: str
    block_size_tokens: float | None = None
    blocks: float | None = None
    capacity_tokens: float | None = None  # as reported
    capacity_from_blocks: float | None = None  # blocks x block size
    max_model_len: float | None = None
    max_concurrency_reported: float | None = None
    max_concurrency_computed: float | None = None  # capacity / max_model_len
    burst_size: int | None = None
    tokens_per_sequence: int | None = None  # largest prompt + max_tokens seen in the burst
    blocks_per_sequence: int | None = None
    burst_blocks: int | None = None
    lines: list[str] = field(default_factory=list)


def _flag_int(info: EngineInfo, *names: str) -> int | None:
    return _setting(info, *names)[0]


def _adapter(info: EngineInfo) -> engines.EngineKind | None:
    return engines.ENGINES.get(info.kind)


def _knob(info: EngineInfo, resource: str) -> tuple[Lever | None, int | None, str]:
    """The engine's lever for a resource, its setting in this run and how to say where that came from."""
    adapter = _adapter(info)
    lever = adapter.lever(resource) if adapter is not None else None
    if lever is None:
        return None, None, ""
    return (lever, *_setting(info, *lever.knob.recorded_as))


def _max_model_len_names(info: EngineInfo) -> tuple[str, ...]:
    """Where a run records the longest request the engine admits: the load generator's probe says max_model_len for
    every engine; the engine's own knob and flag besides."""
    adapter = _adapter(info)
    own = adapter.max_model_len.recorded_as if adapter is not None and adapter.max_model_len else ()
    return ("max_model_len", *own)


def _setting(info: EngineInfo, *names: str) -> tuple[int | None, str]:
    """An integer setting and how to say where it came from: " (now 8)" or " (now 8 per this checkout's knobs)"."""
    value, source = info.flag_source(*names)
    try:
        number = int(float(value)) if value is not None and value is not True else None
    except (TypeError, ValueError):
        number = None
    if number is None:
        return None, ""
    return number, f" (now {number})" if source == "run" else f" (now {number} per this checkout's knobs)"


@dataclass
class QueueEvidence:
    """What the clients and the engine's own timings saw of a queue, besides the gauges."""

    bursts: list[BurstDrain] = field(default_factory=list)
    split: TtftSplit | None = None

    @property
    def client_queued(self) -> int:
        return sum(b.queued for b in self.bursts)

    @property
    def served_after(self) -> int:
        return sum(b.served_after for b in self.bursts)

    @property
    def engine_queued(self) -> int:
        return self.split.queued if self.split is not None and self.split.available else 0

    @property
    def saw_queue(self) -> bool:
        return self.client_queued > 0 or self.engine_queued > 0

    def first_queued_burst(self) -> BurstDrain | None:
        return next((b for b in self.bursts if b.queued), None)

    def text(self) -> str:
        parts = []
        burst = self.first_queued_burst() or (self.bursts[0] if self.bursts else None)
        if burst is not None:
            ttfts = "/".join(f"{t:.3f}" if t is not None else "failed" for _, t in burst.ttft_by_arrival)
            parts.append(
                f"clients: {burst.phase} TTFT by arrival {ttfts} s"
                + (
                    f", {burst.served_after} of {burst.burst_size} first tokens only after another request had finished"
                    if burst.served_after
                    else (f", {burst.queued} of {burst.burst_size} first tokens late" if burst.queued else "")
                )
            )
        if self.split is not None and self.split.available and self.split.queue_share is not None:
            kind = "aggregate " if self.split.aggregate else ""
            parts.append(f"engine timings: {kind}queue {self.split.queue_share:.0%} of the mean TTFT")
        return "; ".join(parts)


def decide(
    info: EngineInfo,
    peaks: dict[str, float | None],
    *,
    gauges: EngineGauges | None = None,
    queue: QueueEvidence | None = None,
    kv: KvArithmetic | None = None,
    phases_ran: bool = True,
) -> Verdict:
    """The verdict for one engine: its gauges (peaks, KV usage while waiting, coverage), weighed with the queue evidence."""
    queue = queue or QueueEvidence()
    if _held_by_durations(info):
        return decide_ollama(info, peaks, gauges=gauges, queue=queue)
    running, waiting, kv_peak = peaks.get(RUNNING), peaks.get(WAITING), peaks.get(KV_USAGE)
    v = Verdict(
        info.instance, info.kind, False, None, "", peak_running=running, peak_waiting=waiting, peak_kv_usage=kv_peak
    )
    kv_max, kv_mean = gauges.kv_while_waiting if gauges is not None else (None, None)
    if waiting and kv_max is None and kv_peak is not None:
        kv_max = kv_mean = kv_peak  # peaks only (no aligned samples): the peak stands for both
    gauge_text = ""
    if waiting is not None:
        kv_text = f"{kv_peak:.1%}" if kv_peak is not None else "unknown"
        gauge_text = (
            f"peak running {numbers.number(running)}, peak waiting {numbers.number(waiting)}, peak KV usage {kv_text}"
        )
        if gauges is not None:
            gauge_text = f"gauges ({_source(gauges)}): {gauge_text}"
    v.evidence = "; ".join(x for x in (gauge_text, queue.text()) if x)
    if waiting is None and not queue.bursts and not queue.engine_queued:
        v.text = f"no verdict: no {WAITING} samples for this engine during the run"
        return v
    v.computable = True
    if waiting:
        _lever(v, info, thresholds.kv_pool_state(kv_max, kv_mean), running, kv_max, kv_mean)
        if queue.bursts and not queue.saw_queue:
            v.disagreement = (
                f"the gauges saw up to {numbers.number(waiting)} waiting, but no request of this run's bursts was served late "
                f"({queue.text()}): the queue came from other traffic, or lasted less than one decode step"
            )
        return v
    if queue.saw_queue:
        missed = _why_gauges_missed(gauges, waiting, queue)
        who = " and ".join(
            x
            for x in (
                "the clients" if queue.client_queued else "",
                "the engine's timings" if queue.engine_queued else "",
            )
            if x
        )
        burst = queue.first_queued_burst()
        admitted = gauges.phase_peaks.get(burst.phase, {}).get(RUNNING) if gauges and burst else None
        if burst is not None and admitted is not None and admitted >= burst.burst_size:
            # The gauges saw every request of the burst running at once: the batch cap let them all in (none
            # waited for a slot), yet first tokens came one by one, later ones even after an earlier had finished.
            v.lever = "none"
            adapter = _adapter(info)
            where = f" ({adapter.prefill_in_batch})" if adapter is not None and adapter.prefill_in_batch else ""
            v.text = (
                f"no slot or KV lever: all {burst.burst_size} requests of {burst.phase} were admitted at once (running "
                f"reached {numbers.number(admitted)}, nothing waiting), but their first tokens came one after another: the "
                f"prompts were processed one at a time inside the running batch{where}, which is where their TTFT went"
            )
            v.text += _oversized(kv_peak, running)
            v.disagreement = (
                f"{who} saw first tokens served one after another, the gauges no queue: the wait was prefill "
                f"inside the batch, not admission"
            )
            return v
        _lever_from_queue(v, info, queue, kv)
        v.disagreement = f"{who} saw requests wait, the gauges did not: {missed}"
        return v
    v.lever = "none"
    v.text = "no lever needed: nothing waited during the run"
    gap = _gauges_gap(gauges) if waiting is None else ""
    if gap:
        v.text += f" (by the clients' times alone: {gap})"
    elif phases_ran and not running:
        v.text += (
            " (but the gauges never saw a request running either: the phases may be shorter than the "
            "sampling interval, so a queue could have come and gone between reads)"
        )
    else:
        v.text += _oversized(kv_peak, running)
    return v


def _gauges_gap(gauges: EngineGauges | None) -> str:
    """Why the gauges have no value at all when every read inside the load phases was missing (the sampler's gaps,
    counted per phase: its source down, too slow, or answering what it should not); "" otherwise."""
    if gauges is None or any(c.samples for c in gauges.coverage.values()):
        return ""
    missing = sum(c.missing for c in gauges.coverage.values())
    reasons = list(dict.fromkeys(r for c in gauges.coverage.values() for r in c.reasons))
    if not missing:
        return ""
    return f"all {missing} reads of the gauges during the load phases got no value ({'; '.join(reasons[:2])})"


def _oversized(kv_peak: float | None, running: float | None) -> str:
    if kv_peak is not None and kv_peak < thresholds.KV_OVERSIZED and running:
        return f"; the KV pool peaked at {kv_peak:.1%}, oversized for this load (the reference page: budget bigger than needed)"
    return ""


def _held_by_durations(info: EngineInfo) -> bool:
    """An engine whose own durations say what its requests waited for (Ollama): its verdict rests on them."""
    adapter = _adapter(info)
    return adapter is not None and adapter.held_s is not None


def _lever(
    v: Verdict, info: EngineInfo, pool: str, running: float | None, kv_max: float | None, kv_mean: float | None
) -> None:
    """Requests waited on the gauges: the lever by the engine's queue rule and the KV pool's state while they waited,
    read by the binding rule's own mapping (servescope/judgements/binding.queue_resource): the knee, the tune loop and this
    verdict agree."""
    adapter = _adapter(info)
    slots, seqs, now = _knob(info, binding.BATCH_SLOTS)
    if adapter is None or slots is None:
        v.lever = "unknown"
        v.text = f"requests waited; no rule for engine kind {info.kind!r}"
        return
    if adapter.queue_means_slots:
        v.lever, v.text = slots.name, _slots_text(info)
        if pool == "full":
            v.text += f" (the slots' context was {kv_mean:.0%} full while they waited)"
        return
    resource = binding.queue_resource(info.kind, kv_max, kv_mean)
    kv, _, space = _knob(info, binding.KV_CAPACITY)
    if resource == binding.KV_CAPACITY and kv is not None:
        v.lever = kv.name
        _, mml = _setting(info, *_max_model_len_names(info))
        caveat = f"; {kv.caveat}" if kv.caveat else ""
        v.text = (
            f"{kv.say(space, mml)}: requests waited while the KV pool was full (mean {kv_mean:.0%} while they "
            f"waited{caveat})"
        )
    elif pool == "between":
        v.lever = "kv_undecided"
        v.text = (
            f"undecided: requests waited with the KV pool between {KV_ROOM:.0%} and {KV_FULL:.0%} full (highest "
            f"{kv_max:.0%}, mean {kv_mean:.0%} while they waited): neither the batch cap ({slots.flag}) nor the "
            f"KV pool is claimed; a burst larger than the cap, or a KV pool pinned full, would tell them apart"
        )
    elif resource == binding.UNDECIDED:
        v.lever = "undetermined"
        v.text = (
            f"undecided: requests waited, but the KV pool's usage while they waited is unknown: the batch cap "
            f"({slots.flag}) and the KV pool cannot be told apart"
        )
    else:
        v.lever = slots.name
        full = (
            " (the running batch hit the cap)" if seqs is not None and running is not None and running >= seqs else ""
        )
        v.text = f"{slots.say(now)}: requests waited while the KV pool had room{full}"


def _slots_text(info: EngineInfo) -> str:
    """An engine that queues only for a slot (llama.cpp defers a request only while no slot is idle): more slots,
    each keeping its share of the context where the context is split over them."""
    slots, count, slots_now = _knob(info, binding.BATCH_SLOTS)
    adapter = _adapter(info)
    kv = adapter.lever(binding.KV_CAPACITY) if adapter is not None and adapter.context_split_over_slots else None
    if kv is None:
        return f"{slots.say(slots_now)}: requests waited for a free slot"
    # not the server's n_ctx: /props reports the per-slot context there
    ctx, _ = _setting(info, *kv.knob.recorded_as)
    per_slot = (
        f"; each slot gets {kv.knob.option} / {slots.knob.option} tokens ({ctx} / {count} = {ctx // count})"
        if ctx and count
        else ""
    )
    return (
        f"{slots.say(slots_now)}: requests waited for a free slot{per_slot}, so raise {kv.env} with it to keep the "
        f"per-slot context"
    )


def decide_ollama(
    info: EngineInfo,
    peaks: dict[str, float | None],
    *,
    gauges: EngineGauges | None = None,
    queue: QueueEvidence | None = None,
    unobserved: str = "",
) -> Verdict:
    """Ollama's verdict: its own durations first, then the bursts' TTFT by arrival; the proxy's running / waiting are
    evidence beside them, never alone (a request waits there until its first chunk, queued or evaluating its prompt).

    `unobserved`: why there are no gauges at all (the report's reason), for the line that says nothing was observed.
    """
    queue = queue or QueueEvidence()
    if info.route == "direct":
        # The proxy saw none of this run's requests: whatever it counted was other traffic.
        peaks, gauges = {}, None
    running, waiting = peaks.get(RUNNING), peaks.get(WAITING)
    v = Verdict(info.instance, info.kind, False, None, "", peak_running=running, peak_waiting=waiting)
    split = queue.split if queue.split is not None and queue.split.available and queue.split.count else None
    least = f"{thresholds.TTFT_QUEUED_MIN_S * 1000:g} ms"
    slots, _, par = _knob(info, binding.BATCH_SLOTS)
    why = ""  # why the proxy observed nothing of this run
    if waiting is not None:
        where = f", {_source(gauges)}" if gauges is not None else ""
        proxy = (
            f"proxy (source=proxy{where}): answers streaming at once at most {numbers.number(running)}, relayed requests "
            f"without their first chunk (queued, loading or evaluating the prompt) at most {numbers.number(waiting)}"
        )
    else:
        why = (
            "this run went to Ollama directly, not through the exporter's proxy"
            if info.route == "direct"
            else unobserved
            or "no running/waiting samples for this engine: no request of this run went through the exporter's "
            "proxy, or nothing read it"
        )
        proxy = f"proxy: not observed ({why})"
    durations = ""
    if split is not None:
        means = split.means_s
        share = f", queue {split.queue_share:.0%} of the mean TTFT" if split.queue_share is not None else ""
        durations = (
            f"Ollama's own durations ({words.count(split.count, 'request')}): {split.queued} held {least} or more outside load, "
            f"prompt evaluation and generation{share}; mean queue {means.get('queue', 0.0):.3f} s, load "
            f"{means.get('load', 0.0):.3f} s, prompt {means.get('prompt', 0.0):.3f} s of a mean TTFT "
            f"{numbers.fixed(split.ttft_mean_s, 3)} s"
        )
    clients = QueueEvidence(queue.bursts).text()
    v.evidence = "; ".join(x for x in (durations, clients, proxy) if x)
    streamed = f"; answers streaming at once through the proxy: at most {numbers.number(running)}" if running else ""

    if split is not None:
        v.computable = True
        if split.queued:
            v.lever = slots.name
            share = f" ({split.queue_share:.0%} of the mean TTFT)" if split.queue_share is not None else ""
            v.text = (
                f"{slots.say(par)}: Ollama's own durations say requests waited for a slot: "
                f"{split.queued} of {split.count} spent {least} or more inside Ollama outside load, prompt "
                f"evaluation and generation, {split.means_s.get('queue', 0.0):.3f} s on average{share}{streamed}"
            )
            if queue.bursts and not queue.client_queued:
                v.disagreement = (
                    "Ollama's durations saw requests wait, but every first token of this run's bursts came on time: "
                    "the waits were in its other phases"
                )
            elif waiting == 0:
                v.disagreement = (
                    "the engine's timings saw requests wait (Ollama's own durations), the proxy's reads never saw a "
                    "relayed request without its first chunk: the waits fell between its reads"
                )
            return v
        v.lever = "none"
        if queue.client_queued:
            load, prompt = split.means_s.get("load", 0.0), split.means_s.get("prompt", 0.0)
            went = (
                f"loading the model (mean load_duration {load:.3f} s: a cold start; OLLAMA_KEEP_ALIVE keeps it loaded)"
                if load >= prompt
                else f"evaluating the prompts (mean prompt_eval_duration {prompt:.3f} s)"
            )
            v.text = (
                f"no {slots.env} lever: first tokens came late in the bursts, but Ollama's own durations show "
                f"no request waiting inside it (each under {least} outside load, prompt evaluation and generation): "
                f"the time went to {went}"
            )
            v.disagreement = (
                "the clients saw first tokens late, Ollama's durations no queue: the wait was inside the model, "
                "not for a slot"
            )
            return v
        v.text = (
            f"no lever needed: Ollama's own durations show no request waiting inside it ({words.count(split.count, 'request')}, "
            f"each under {least} outside load, prompt evaluation and generation)"
        )
        return v

    nothing_else = "the records carry no Ollama durations"
    if queue.served_after:
        v.computable, v.lever = True, slots.name
        v.text = (
            f"{slots.say(par)}: in the bursts, {queue.served_after} first tokens came only after "
            f"another request had finished (the clients' TTFT by arrival), which is a wait for a slot; "
            f"{nothing_else} to confirm it{streamed}"
        )
    elif queue.client_queued:
        v.computable, v.lever = True, "undetermined"
        v.text = (
            "undetermined: first tokens came one after another in the bursts, which is a queue for a slot or prompts "
            f"evaluated one at a time; {nothing_else}, so they cannot be told apart"
        )
    elif queue.bursts:
        v.computable, v.lever = True, "none"
        v.text = f"no lever needed: every first token of this run's bursts came on time; {nothing_else}"
    elif waiting:
        v.computable, v.lever = True, "undetermined"
        v.text = (
            f"undetermined: the only evidence is the proxy's count of relayed requests without their first chunk "
            f"(up to {numbers.number(waiting)}), which counts queueing, model loading and prompt evaluation alike; this run has "
            f"no Ollama durations and no burst to tell them apart"
        )
    elif waiting is not None:
        v.computable, v.lever = True, "none"
        v.text = (
            "no lever needed: the proxy saw no relayed request without its first chunk at any read (a wait shorter "
            "than the interval between reads can be missed); nothing else in this run (no Ollama durations, no "
            "burst) says more"
        )
    else:
        v.text = (
            f"no verdict: Ollama's running/waiting were not observed ({why}), and nothing else in this run tells "
            f"whether requests waited: {nothing_else}, and there is no burst"
        )
    return v


def _lever_from_queue(v: Verdict, info: EngineInfo, queue: QueueEvidence, kv: KvArithmetic | None) -> None:
    """Requests waited by the clients' or the engine's account, not the gauges': the lever from the flags and section 3."""
    adapter = _adapter(info)
    slots, seqs, now = _knob(info, binding.BATCH_SLOTS)
    pool = adapter.lever(binding.KV_CAPACITY) if adapter is not None else None
    if adapter is None or slots is None:
        v.lever = "unknown"
        v.text = f"requests waited; no rule for engine kind {info.kind!r}"
    elif adapter.queue_means_slots:
        v.lever, v.text = slots.name, _slots_text(info)
    else:
        size = max((b.burst_size for b in queue.bursts), default=None)
        fits = kv is not None and kv.burst_blocks is not None and kv.blocks and kv.burst_blocks <= kv.blocks
        if seqs is not None and size is not None and size > seqs:
            v.lever = slots.name
            v.text = (
                f"{slots.say(now)}: the burst of {size} is more than the batch cap, so requests waited for a slot"
                + (f"; the burst's {kv.burst_blocks} KV blocks fit the pool of {kv.blocks:,.0f}" if fits else "")
            )
        elif (
            pool is not None
            and kv is not None
            and kv.burst_blocks is not None
            and kv.blocks
            and kv.burst_blocks > kv.blocks
        ):
            v.lever = pool.name
            v.text = f"{pool.say()}: the burst needs {kv.burst_blocks} KV blocks, the pool has {kv.blocks:,.0f}"
        else:
            v.lever = "undetermined"
            v.text = (
                f"requests waited, but without the KV usage while they waited the lever cannot be told: compare "
                f"{slots.flag}{now} with the burst size and the KV pool (the KV cache arithmetic under the verdicts)"
            )


def _why_gauges_missed(gauges: EngineGauges | None, waiting: float | None, queue: QueueEvidence) -> str:
    """Why the gauges show no queue where the clients or the engine saw one."""
    if gauges is None or waiting is None:
        return "the gauges have no waiting samples for this engine"
    burst = queue.first_queued_burst() or (queue.bursts[0] if queue.bursts else None)
    if burst is None:
        return f"the waiting gauge stayed 0 ({_source(gauges)})"
    if gauges.source != "samples":
        points = sum(
            1
            for t, v in gauges.series.get(WAITING, [])
            if v is not None
            and burst.started_at is not None
            and burst.started_at <= t <= burst.started_at + burst.wall_s
        )
        return (
            f"gauges under-sampled: {words.count(points, 'Prometheus point')} during a {burst.wall_s:.1f} s burst "
            f"(query step {gauges.spacing_s:g} s over scrapes seconds apart): a queue shorter than a scrape "
            f"interval is invisible to it"
        )
    cov = gauges.coverage.get(burst.phase)
    taken = cov.samples if cov else 0
    if cov is not None and cov.missing:
        missing = words.noun(cov.missing, "is", "are")
        return (
            f"{cov.missing} of {words.count(taken + cov.missing, 'sample')} during {burst.phase} {missing} missing "
            f"({'; '.join(cov.reasons)})"
        )
    if taken < thresholds.MIN_SAMPLES_PER_BURST:
        return (
            f"gauges under-sampled: {words.count(taken, 'sample')} during a {burst.wall_s:.1f} s burst "
            f"({_source(gauges)})"
        )
    return (
        f"the waiting gauge stayed 0 across {words.count(taken, 'sample')} during {burst.phase}: the queue is not where the engine "
        f"counts it"
    )


def _source(gauges: EngineGauges) -> str:
    if gauges.source == "samples":
        return f"samples every {gauges.spacing_s * 1000:g} ms" if gauges.spacing_s else "samples"
    return f"Prometheus, step {gauges.spacing_s:g} s" if gauges.spacing_s else "Prometheus"


def build(
    run: Run,
    gauges: GaugeReport,
    drains: Sequence[BurstDrain] = (),
    splits: Sequence[TtftSplit] = (),
    kv: Sequence[KvArithmetic] = (),
) -> list[Verdict]:
    out = []
    splits_by = {s.instance: s for s in splits}
    kv_by = {a.instance: a for a in kv}
    for instance, info in run.engines.items():
        queue = QueueEvidence([d for d in drains if d.instance == instance], splits_by.get(instance))
        eg = gauges.engines.get(instance) if gauges.available else None
        if _held_by_durations(info):
            # Not the gauges first: Ollama's own durations and the bursts decide, the proxy's gauges stand beside them.
            sampled = eg is not None and bool(eg.series)
            out.append(
                decide_ollama(
                    info,
                    eg.peaks if sampled else {},
                    gauges=eg if sampled else None,
                    queue=queue,
                    unobserved=gauges.reason if not gauges.available else "",
                )
            )
            continue
        if eg is None and not queue.saw_queue:
            why = gauges.reason if not gauges.available else "no gauge series for this engine"
            out.append(
                Verdict(instance, info.kind, False, None, f"no verdict can be made: the gauges had no data ({why})")
            )
            continue
        peaks = eg.peaks if eg is not None and eg.series else {}
        out.append(
            decide(
                info,
                peaks,
                # Reads with no value still count: their gaps (coverage) are what the verdict says it lacked.
                gauges=eg if eg is not None and (eg.series or eg.coverage) else None,
                queue=queue,
                kv=kv_by.get(instance),
                phases_ran=bool(run.phases_of(instance)),
            )
        )
    return out


def refuse_flagged(verdicts: list[Verdict], run: Run, assessment: Assessment) -> list[Verdict]:
    """A verdict never rests on a flagged phase (servescope/report/noise.py: an outlier request): it names the ones it left out,
    to be rerun. Phases measured on a busy host are concluded from, and said: the verdict's evidence is which gauges
    held requests and in which order first tokens came, which a slower host stretches but does not create.

    The verdicts come from the run without its flagged phases; an engine with no trusted phase
    left gets no verdict at all.
    """
    out = []
    for v in verdicts:
        noisy = assessment.noisy(v.instance)
        if noisy and v.computable:
            worst = worst_slowdown(noisy)
            v.busy = (
                f"{len(noisy)} of the phases it rests on were measured on a busy host (up to x{worst:.2f} slower by "
                f"the CPU others took; e.g. {noisy[0].noisy[0]})"
            )
        flagged = assessment.flagged(v.instance)
        if flagged:
            v.left_out = [f"{t.phase}: {'; '.join(t.flags)}" for t in flagged]
            if not any(assessment.usable(p) for p in run.phases_of(v.instance)):
                v = Verdict(
                    v.instance,
                    v.engine,
                    False,
                    None,
                    f"no verdict: every phase of {v.instance} held outlier requests, and none is concluded from; "
                    f"rerun {', '.join(t.phase for t in flagged)}",
                    left_out=v.left_out,
                )
        out.append(v)
    return out


def kv_arithmetic(run: Run, gauges: GaugeReport) -> list[KvArithmetic]:
    """The reference page's section 3: blocks x block size = tokens; tokens / max-model-len = max concurrency; does
    the burst fit."""
    out = []
    for instance, info in run.engines.items():
        eg = gauges.engines.get(instance)
        kv = eg.kv if eg else {}
        a = KvArithmetic(instance)
        a.block_size_tokens = kv.get(series.KV_BLOCK_SIZE)
        a.blocks = kv.get(series.KV_BLOCKS)
        a.capacity_tokens = kv.get(series.KV_CAPACITY_TOKENS)
        a.max_concurrency_reported = kv.get(series.KV_MAX_CONCURRENCY)
        if a.blocks is not None and a.block_size_tokens:
            a.capacity_from_blocks = capacity_tokens(a.blocks, a.block_size_tokens)
        capacity = a.capacity_tokens if a.capacity_tokens is not None else a.capacity_from_blocks
        mml = _flag_int(info, *_max_model_len_names(info))
        if mml is None and capacity and a.max_concurrency_reported:
            mml = round(capacity / a.max_concurrency_reported)
        a.max_model_len = mml
        if capacity and mml:
            a.max_concurrency_computed = max_concurrency(capacity, mml)
        bursts = [p for p in run.phases_of(instance) if p.scenario == "burst"]
        if bursts:
            a.burst_size = max(p.concurrency for p in bursts)
            burst_names = {p.phase for p in bursts}
            recs = [r for r in run.requests_of(instance) if r.phase in burst_names]
            longest = max(((r.prompt_tokens or 0) + (r.max_tokens or 0) for r in recs), default=0)
            if longest:
                a.tokens_per_sequence = longest
                if a.block_size_tokens:
                    a.blocks_per_sequence = blocks_for(longest, a.block_size_tokens)
                    a.burst_blocks = a.blocks_per_sequence * a.burst_size
        a.lines = _kv_lines(a, capacity)
        out.append(a)
    return out


def _kv_lines(a: KvArithmetic, capacity: float | None) -> list[str]:
    lines = []
    if a.blocks is not None and a.block_size_tokens:
        lines.append(
            f"{a.blocks:,.0f} blocks x {a.block_size_tokens:,.0f} tokens/block = {a.capacity_from_blocks:,.0f} tokens"
            + (
                f" (engine reports {a.capacity_tokens:,.0f})"
                if a.capacity_tokens is not None and abs(a.capacity_tokens - a.capacity_from_blocks) >= 1
                else ""
            )
        )
    elif capacity:
        lines.append(f"KV cache capacity {capacity:,.0f} tokens (block count not reported)")
    if capacity and a.max_model_len:
        lines.append(
            f"{capacity:,.0f} tokens / {a.max_model_len:,.0f} tokens max-model-len = "
            f"{a.max_concurrency_computed:.2f}x max concurrency at full length"
            + (f" (engine reports {a.max_concurrency_reported:.2f}x)" if a.max_concurrency_reported else "")
        )
    if a.burst_blocks is not None and a.blocks:
        share = a.burst_blocks / a.blocks
        lines.append(
            f"this run's burst: {a.burst_size} x ceil({a.tokens_per_sequence} tokens / "
            f"{a.block_size_tokens:,.0f}) = {a.burst_blocks} blocks at most, {share:.1%} of the pool"
            + (" -> does not fit: KV space is the limit" if share > 1 else "")
        )
    return lines


def to_json(verdicts: list[Verdict], kv: list[KvArithmetic], kinds: Sequence[str] | None = None) -> dict:
    return {
        "rule": rule(kinds),
        "kv_full_threshold": KV_FULL,
        "kv_room_threshold": KV_ROOM,
        "verdicts": [asdict(v) for v in verdicts],
        "kv_arithmetic": [asdict(a) for a in kv],
    }
