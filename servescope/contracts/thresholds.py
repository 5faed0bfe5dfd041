"""The one table of thresholds that decide which lever to pull: the report's verdict reads it, the alert rules are generated from it.

The reference page's section 4 reads two gauges together: requests waiting while the KV pool has room
means the scheduler's batch cap is the limit (vLLM: --max-num-seqs); waiting while the pool is
near 100% means KV blocks are (VLLM_CPU_KVCACHE_SPACE / --max-model-len). Between the two
bounds neither lever is claimed. Both readers apply the same statistics over the time requests
waited: the pool "had room" when its HIGHEST usage stayed below KV_ROOM, it "was full" when its
MEAN usage reached KV_FULL (a pool pinned near full, not one that touched it once).

`python -m servescope.prometheus.lever_rules --write` regenerates prometheus/rules/ from this table; the
tests fail when the committed rules are stale. The SLO defaults are here too (servescope/judgements/slo.py reads
them; the SLO and SLO_ATTAINMENT knobs, --slo flags and the web UI override them), and the rules that
name the binding resource at the knee (servescope/judgements/binding.py) and flag an open-loop client that fell
behind its schedule (servescope/report/schedule.py).


The second half says when a measurement can be trusted on a shared machine, where another program can take
the CPU while a phase runs: when a warm-up is over, when a phase was measured on a noisy host, when a request is
an outlier. Each
of those is a knob (.env.example, overridable by the environment), read when the rule is applied,
so a report can re-judge an old run. How many repetitions the reference experiment runs (3 for
`make up`) is the load generator's option --repetitions, whose default is the knob LOADGEN_REPETITIONS.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from servescope.contracts import knobs

# --- the KV pool while requests wait (ratios 0..1 of servescope_kv_cache_usage_ratio) ---
KV_FULL = 0.9  # mean usage while waiting at or above this: the pool is the limit ("near 100%" on the reference page)
KV_ROOM = 0.8  # highest usage while waiting below this: the pool had room, the batch cap is the limit
KV_OVERSIZED = 0.05  # peak usage below this while requests ran: the pool is far bigger than this load needs

# --- a fleet in the report: at this many instances of one engine kind, the gauges section summarises them (the
# spread of their peaks, which queued, the busiest FLEET_TOP_N) and draws their derived sum, not a plot each ---
FLEET_SUMMARY_INSTANCES = 5
FLEET_TOP_N = 10

# --- the alert rules: a queue counts when it never drained over WINDOW, and only after it lasted FOR ---
ALERT_WINDOW = "1m"
ALERT_FOR = "1m"

# --- what the clients saw in a burst (TTFT by arrival order) ---
# A request of a burst waited before its first token when its TTFT reached TTFT_QUEUED_RATIO x the
# burst's fastest and at least TTFT_QUEUED_MIN_S more: requests prefilled in the same step, or a
# step or two apart, stay below it; one served after another (the reference page's 0.02 / 0.59 / 1.14 s) does not.
TTFT_QUEUED_RATIO = 2.0
TTFT_QUEUED_MIN_S = 0.05
# ...and it waited for a slot when its first token came no earlier than this many seconds before
# another request of the same burst had finished: it was admitted when that one left.
SERVED_AFTER_SLACK_S = 0.005
# A burst is under-sampled by the gauges when fewer samples than this fell inside it: a queue can
# come and go between two of them.
MIN_SAMPLES_PER_BURST = 3


# --- service level objectives (servescope/judgements/slo.py): what a request must meet to count as good ---
# Terms METRIC[_pQ]<=SECONDS: a percentile term holds for a phase when at least Q% of its requests (ITL: of
# its gaps) meet the limit; a plain term judges every request alone. Used when the SLO knob is empty.
SLO_DEFAULT = "ttft_p95<=0.5,itl_p95<=0.1"
# The share of requests that must be good for a phase with per-request terms to meet its SLOs, and the
# objective the Prometheus burn-rate rules divide by (1 - SLO_ATTAINMENT is the error budget).
SLO_ATTAINMENT = 0.95
# `python -m loadgen quick` answers "how many users at once" for a newcomer's engine, most often a CPU one: the
# default above fails vLLM-CPU at one user on a 2-core machine, so quick's default is what a person
# chatting still finds usable (the first token within 2 s, then at least 5 tokens/s) for 90% of requests, the
# objective servebench's `quick` uses. The SLO and SLO_ATTAINMENT knobs and --slo / --slo-attainment override both.
QUICK_SLO_DEFAULT = "ttft<=2,tpot<=0.2"
QUICK_SLO_ATTAINMENT = 0.9

# --- the binding resource at the knee (servescope/judgements/binding.py): each name needs its own evidence ---
# Requests "waited" at a load when at least this share of the phase's samples saw waiting > 0: a queue
# that shows once between two reads is a step's admission, not a resource that ran out.
BINDING_WAITING_SHARE = 0.2
# Batch slots (an engine that queues for KV too, vLLM): requests waited while the running batch sat at its ceiling
# in at least this share of those samples. Waiting beside a batch below its peak is the scheduler's own pace (its
# per-step token budget admitting long prompts a few at a time), which no slot knob moves: neither is claimed.
SLOT_CEILING_SHARE = 0.8
# Compute: the latency the SLOs failed on grew at least this much from the lightest load measured while the batch
# grew (every request admitted, each step slower), AND the engine used at least ENGINE_CPU_NEAR of the cores it could
# (its affinity or cgroup quota, less what other programs, servescope's observers and the load generator took).
COMPUTE_GROWTH = 1.25
ENGINE_CPU_NEAR = 0.8
# ... and only when other programs left the engine at least this many cores: an engine squeezed to a sliver of a core
# by foreign load "uses all it could have" whatever bounds it (seen: a sleeping double named compute while two other
# suites filled the machine).
ENGINE_CORES_LEFT_MIN = 0.5
# Client: the load generator's own thread was busy (its CPU plus the time it waited, ready, for a core) this share of
# the phase: it could not send and read on time, so the latencies are partly its own.
CLIENT_BUSY_SHARE = 0.9
# ...or it waited, ready to run, for a core this share of the phase (a starved client: every stamp it took was late by
# its turn; beside engines on 2 busy cores it waited 2-7% in the live knees).
CLIENT_WAIT_SHARE = 0.25
# Engine fault: at least this share of the level's requests found no engine (refused, timed out, cut), or the
# exporter could not read the engine for this many seconds of it. Not a capacity measurement.
FAULT_FAILED_SHARE = 0.1
FAULT_UNREAD_S = 1.0
# SLO below the floor (open loop): the lowest rate's requests ran alone when at most this share overlapped another.
ALONE_OVERLAP_SHARE = 0.1

# --- prefix-cache reuse a workload did not ask for (servescope/judgements/prefix_reuse.py) ---
# A fresh prompt per request shares only the chat template with the others (llama.cpp reuses those few tokens, a
# few % of a 256-token prompt; vLLM's blocks of 16-128 tokens none): reuse above this share means repeats.
PREFIX_REUSE_UNASKED = 0.2
# ...unless what was reused is no more than a chat template a request (SmolLM2's adds about 30 tokens, longer system
# prompts of other models about 60): a prompt of a few words is mostly template, reused by every request alike.
TEMPLATE_TOKENS = 64

# --- open-loop honesty (servescope/report/schedule.py): the client fell behind its own schedule ---
# A rate run whose send lag behind the schedule has a p99 above this did not send the load it claims:
# its send-based latency hides the wait (coordinated omission); the schedule-based one shows it.
SCHEDULE_LAG_P99_MAX_S = 0.05

# --- the regression gate (servescope/report/check.py; its tolerance is the knob CHECK_TOLERANCE_PCT) ---
# A tail percentile is gated only when each side has at least this many samples beyond it (p95: 200 requests,
# p99: 1,000): fewer, and the percentile is one or two of the slowest requests, which a rerun moves at will.
CHECK_TAIL_BEYOND = 10


def kv_pool_state(kv_max_while_waiting: float | None, kv_mean_while_waiting: float | None) -> str:
    """ "full", "room", "between" or "unknown": the KV pool's state over the time requests waited."""
    if kv_mean_while_waiting is not None and kv_mean_while_waiting >= KV_FULL:
        return "full"
    if kv_max_while_waiting is not None and kv_max_while_waiting < KV_ROOM:
        return "room"
    if kv_max_while_waiting is None and kv_mean_while_waiting is None:
        return "unknown"
    return "between"


def minutes(duration: str) -> int:
    """Whole minutes of a Prometheus duration like "1m" or "120s" (the rules' texts say how long a queue lasted)."""
    if duration.endswith("m") and duration[:-1].isdigit():
        return int(duration[:-1])
    if duration.endswith("s") and duration[:-1].isdigit() and int(duration[:-1]) % 60 == 0:
        return int(duration[:-1]) // 60
    raise ValueError(f"duration {duration!r} is not a whole number of minutes like 1m or 120s")


# --- trustworthy numbers on a shared machine: warm-up, host noise, outliers (knobs in .env.example) ---


def knob_number(key: str, low: float = 0.0, high: float = math.inf) -> float:
    """A numeric knob, or ValueError with the one line to show."""
    value = knobs.get(key)
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not low <= number <= high:  # NaN fails too
        bound = f"from {low:g} to {high:g}" if math.isfinite(high) else f">= {low:g}"
        raise ValueError(f"{key}={value!r}: expected a number {bound}")
    return number


@dataclass(frozen=True)
class WarmupRule:
    """Warm-up is over once `count` consecutive latencies agree: (max - min) / median <= tolerance; never past max_s."""

    count: int  # WARMUP_STABLE_COUNT
    tolerance: float  # WARMUP_TOLERANCE, a fraction of the median
    max_s: float  # WARMUP_MAX_S: the warm-up's time bound

    @classmethod
    def current(cls) -> WarmupRule:
        return cls(
            int(knob_number("WARMUP_STABLE_COUNT", 1, 1000)),
            knob_number("WARMUP_TOLERANCE", 0, 100),
            knob_number("WARMUP_MAX_S", 0),
        )

    def spread(self, latencies: list[float]) -> float | None:
        """(max - min) / median of the last `count` latencies; None until there are that many."""
        last = latencies[-self.count :]
        if len(last) < self.count or not last:
            return None
        mid = statistics.median(last)
        return (max(last) - min(last)) / mid if mid > 0 else 0.0

    def stable(self, latencies: list[float]) -> bool:
        spread = self.spread(latencies)
        return spread is not None and spread <= self.tolerance

    def text(self) -> str:
        return (
            f"{self.count} consecutive warm-up latencies within {self.tolerance:.0%} of their median "
            f"(at most {self.max_s:g} s)"
        )


@dataclass(frozen=True)
class NoiseRule:
    """When a phase or a request is not trusted (servescope/report/noise.py and the load generator apply it)."""

    group_cores: float  # NOISE_GROUP_CPU_CORES: one other program (an engine, a process name) used this much
    foreign_cores: float  # NOISE_FOREIGN_CPU_CORES: everything else together used this much
    steal_share: float  # NOISE_STEAL_SHARE: the hypervisor took this share of the machine's CPU time
    outlier_ratio: float  # OUTLIER_RATIO: a request took this many times its phase's median

    @classmethod
    def current(cls) -> NoiseRule:
        return cls(
            knob_number("NOISE_GROUP_CPU_CORES"),
            knob_number("NOISE_FOREIGN_CPU_CORES"),
            knob_number("NOISE_STEAL_SHARE", 0, 1),
            knob_number("OUTLIER_RATIO", 1),
        )

    def text(self) -> str:
        return (
            f"a phase is flagged noisy when, averaged over the phase, one other program (another engine, or the "
            f"processes of one name) used at least {self.group_cores:g} of a core, all processes other than the "
            f"engine under test, the load generator and servescope's own exporter/Prometheus used at least "
            f"{self.foreign_cores:g} cores together, or the hypervisor stole at least {self.steal_share:.0%} of the "
            f"CPU time; a request is an outlier when its time is more than {self.outlier_ratio:g}x the median of "
            f"its phase over all repetitions"
        )
