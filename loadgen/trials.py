"""Repeated, interleaved trials: warm-up until stable, the A B B A schedule of repetitions, host noise per phase, retries.

One pass of the reference experiment is one trial; a shared machine turns a transient into a headline
(a sequential pass starved of CPU for a minute reads as a "batching" factor the engine does not have).
So each engine is warmed until its latencies agree (thresholds.WarmupRule), the experiment runs K
repetitions with engines and phases interleaved and their order reversed every other repetition
(A1 A2 B1 B2 | B2 B1 A2 A1 | ...) so a drift over the run hits every engine and phase alike, each phase
record carries the host's noise while it ran (servescope/host/hostnoise.py) and the machine's energy
(servescope/host/energy.py), and a phase flagged noisy may be run again.
When the schedule switches engines, the next phase waits until the engines measured before have
gone quiet (settle): vLLM's CPU backend keeps part of a core busy for seconds after its own load,
which would flag the next engine's phase as noisy even on an otherwise idle machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import gevent
from gevent.event import Event

from loadgen import client as llm
from loadgen.scenarios import Phase, Settings
from loadgen.targets import Target
from servescope.contracts.runfolder import PhaseRecord
from servescope.contracts.thresholds import NoiseRule, WarmupRule
from servescope.host import energy, hostnoise
from servescope.text import numbers, words


class MoreRepetitions:
    """Passes of the reference experiment added while an engine's scaling factor is undecided (servescope/report/table.estimate:
    its noise-widened CI straddles a reading's bound), up to a cap; the run's planner (loadgen/phase_driver.py).

    After the schedule's last phase it reads the run folder as the report does; each engine still undecided gets one
    more pass (the undecided engines interleaved, their order reversed every other pass), then it judges again."""

    def __init__(
        self,
        targets: list[Target],
        one_pass: Callable[[Target, int], list[Phase]],
        scheduled: int,
        cap: int,
        last: Phase,
    ):
        self.targets, self.one_pass, self.cap = targets, one_pass, cap
        self.passes = {t.instance: scheduled for t in targets}
        self.last = last  # the phase after which the factors are judged
        self.pending: list[Phase] = []
        self.outcome: dict[str, str] = {}  # per engine: what the judgement said last

    def after(self, phase: Phase, folder) -> Phase | None:
        if self.pending:
            return self.pending.pop(0)
        if phase is not self.last:
            return None
        undecided = self._undecided(folder)
        more = [t for t in self.targets if t.instance in undecided and self.passes[t.instance] < self.cap]
        for t in self.targets:
            if t.instance in undecided and t not in more:
                self.outcome[t.instance] = (
                    f"{undecided[t.instance]}: still undecided after {self.passes[t.instance]} repetitions "
                    f"(LOADGEN_MAX_REPETITIONS={self.cap})"
                )
        if not more:
            return None
        repetition = max(self.passes[t.instance] for t in more) + 1
        order = more if repetition % 2 else list(reversed(more))
        added: list[Phase] = []
        for t in order:
            self.passes[t.instance] += 1
            phases = self.one_pass(t, self.passes[t.instance])
            added.extend(phases if repetition % 2 else reversed(phases))
            print(
                f"loadgen: {t.instance}: {undecided[t.instance]}: adding repetition {self.passes[t.instance]} "
                f"(at most {self.cap}: LOADGEN_MAX_REPETITIONS)",
                flush=True,
            )
            self.outcome[t.instance] = f"{self.passes[t.instance]} repetitions in all (added while undecided)"
        for p in added:
            p.planner = self
        self.last = added[-1]
        self.pending = added[1:]
        return added[0]

    def _undecided(self, folder) -> dict[str, str]:
        """Engine -> its burst's undecided factor in one clause, read from the run folder as the report reads it."""
        # the report's reader and table: one rule for the run and the report
        from servescope.report import load as report_load
        from servescope.report import table as report_table

        try:
            run = report_load.load(folder.path)
        except report_load.RunError:
            return {}
        out = {}
        for row in report_table.build(run):
            if row.undecided and row.scaling_factor is not None:
                ci = report_table.ci_text(row.scaling_ci, "x")
                out.setdefault(row.instance, f"scaling {row.scaling_factor:.2f}x{ci}, {row.undecided}")
        return out

    def lines(self) -> list[str]:
        return [f"repetitions of {instance}: {text}" for instance, text in self.outcome.items()]


def interleave(targets: list[Target], one_pass: Callable[[Target, int], list[Phase]], repetitions: int) -> list[Phase]:
    """K repetitions of every engine's phases; odd repetitions in order, even ones reversed (A B B A)."""
    schedule: list[Phase] = []
    for repetition in range(1, repetitions + 1):
        forward = repetition % 2 == 1
        for target in targets if forward else reversed(targets):
            phases = one_pass(target, repetition)
            schedule.extend(phases if forward else reversed(phases))
    return schedule


# ---------------------------------------------------------------- the chat template's share of a prompt


def measure_template(target: Target, settings: Settings, *, http_client: str, timeout_s: float) -> str:
    """What the engine's chat template adds to every prompt, in its own tokens (into target.info["template_tokens"]),
    so a fresh set's TOKENS is the prompt as the engine counts it. One request of one output token, not recorded:
    its prompt is the set's own words, about one token each, so the engine's count less the words is the template.
    Returns the line to show."""
    prompt = settings.prompt_set.prompt(0, "template")
    words = len(prompt.text.split())
    payload = llm.chat_payload(target.api, target.model, prompt.text, 1, settings.temperature, False)
    transport = llm.make_transport(http_client, target.url, timeout=timeout_s)
    try:
        m = llm.stream_chat(transport, target.chat_path, target.api, payload)
    finally:
        transport.close()
    if not m.ok or m.prompt_tokens is None:
        why = m.error if not m.ok else "the engine did not count the prompt's tokens"
        return (
            f"{target.instance}: chat template not measured ({why}): prompts of {settings.prompt_set.name} are "
            f"TOKENS words, plus whatever the template adds"
        )
    template = max(0, m.prompt_tokens - words)
    target.info["template_tokens"] = template
    return (
        f"{target.instance}: the chat template adds {template} prompt tokens (a {words}-word prompt counted as "
        f"{m.prompt_tokens}): {settings.prompt_set.name} draws that many words fewer, so a prompt is its TOKENS"
    )


# ---------------------------------------------------------------- warm-up until stable


def warm_up(
    target: Target,
    settings: Settings,
    minimum: int,
    *,
    http_client: str,
    timeout_s: float,
    say: Callable[[str], None],
    interrupted: Event,
    rule: WarmupRule | None = None,
) -> dict | None:
    """Warm-up requests (never recorded) until the engine's latencies agree; returns what happened, None if interrupted.

    At least `minimum` requests (0: no warm-up), then until rule.count consecutive latencies are within
    rule.tolerance of their median, for at most rule.max_s seconds. The same prompt every time, so the
    latencies are comparable; a failure starts the count again, and rule.count failures in a row end it.
    """
    rule = rule or WarmupRule.current()
    result = {"requests": 0, "stable": False, "seconds": 0.0, "latencies_s": [], "rule": rule.text()}
    if minimum <= 0:
        result["stable"] = None  # not asked for
        return result
    prompt = settings.prompt_set.warmup_text(0)
    payload = llm.chat_payload(
        target.api, target.model, prompt, settings.max_tokens, settings.temperature, bool(target.ignore_eos)
    )
    transport = llm.make_transport(http_client, target.url, timeout=timeout_s)
    started = time.monotonic()
    latencies: list[float] = []  # since the last failure
    failures = 0
    try:
        while True:
            job = gevent.spawn(llm.stream_chat, transport, target.chat_path, target.api, payload)
            gevent.wait([job, interrupted], count=1)
            if interrupted.is_set():
                job.kill()
                return None
            m = job.value
            result["requests"] += 1
            n = result["requests"]
            if m.ok and m.elapsed_s is not None:
                latencies.append(m.elapsed_s)
                failures = 0
                say(f"warm-up {target.instance} {n}: ok {m.elapsed_s:.3f}s (not recorded)")
            else:
                latencies.clear()
                failures += 1
                say(f"warm-up {target.instance} {n}: FAILED ({m.error}) (not recorded)")
            result["latencies_s"].append(m.elapsed_s if m.ok else None)
            result["seconds"] = time.monotonic() - started
            last = "/".join(f"{x:.3f}" for x in latencies[-rule.count :])
            spread = rule.spread(latencies)
            if n >= minimum and rule.stable(latencies):
                result["stable"] = True
                say(
                    f"warm-up {target.instance}: stable after {words.count(n, 'request')}, {result['seconds']:.1f}s (last "
                    f"{rule.count}: {last} s, spread {spread:.0%} <= {rule.tolerance:.0%})"
                )
                return result
            if failures >= rule.count:
                say(
                    f"warm-up {target.instance}: {failures} requests failed in a row ({m.error}): measuring anyway; "
                    f"expect failed requests"
                )
                return result
            if result["seconds"] >= rule.max_s:
                how = f"spread {spread:.0%} > {rule.tolerance:.0%}" if spread is not None else "too few successes"
                say(
                    f"warm-up {target.instance}: NOT stable after {result['seconds']:.0f}s and {n} requests "
                    f"(last {rule.count}: {last or '-'} s, {how}; WARMUP_MAX_S={rule.max_s:g}): measuring anyway; "
                    f"the engine's latency was still moving, so read its numbers with care"
                )
                return result
    finally:
        transport.close()


# ---------------------------------------------------------------- settle after an engine switch

SETTLE_WINDOW_S = 1.0  # one read of the other engines' CPU: short enough to follow a tail of a few seconds


def settle(
    roles: hostnoise.Roles,
    max_s: float,
    *,
    say: Callable[[str], None],
    interrupted: Event,
    instance: str,
    rule: NoiseRule | None = None,
) -> dict | None:
    """Wait until the other engines use under half the noise rule's per-program line, at most max_s; what happened.

    Half the line, read over one window, so that a tail still falling cannot average up to the line
    over the phase. None when there is nothing to wait for (max_s 0, no other engine on this host).
    """
    if max_s <= 0 or not roles.others:
        return None
    rule = rule or NoiseRule.current()
    quiet = rule.group_cores / 2
    watch = hostnoise.Watch(hostnoise.Roles(others=roles.others, loadgen=roles.loadgen))
    started = time.monotonic()
    while True:
        watch.begin()
        if interrupted.wait(timeout=SETTLE_WINDOW_S):
            return None
        noise = watch.measure()
        if noise is None:  # the host could not be read: nothing to wait for that can be seen
            say(f"settle: {watch.unread or 'host noise not read'}: measuring {instance} without waiting")
            return None
        cores = hostnoise.other_engine_cores(noise)
        waited = round(time.monotonic() - started, 2)  # the line and the record say the same
        if cores < quiet:
            if waited > SETTLE_WINDOW_S * 1.5:  # more than the one read: say what was waited for
                say(f"settle: {waited:.1f}s until the other engines went quiet before {instance} ({cores:.2f} cores)")
            return {"waited_s": waited, "other_engines_cores": round(cores, 3), "settled": True}
        if waited >= max_s:
            say(
                f"settle: the other engines still use {numbers.cores(cores)} after {waited:.0f}s "
                f"(LOADGEN_SETTLE_MAX_S={max_s:g}): measuring {instance} anyway; the phase's noise says how much"
            )
            return {"waited_s": waited, "other_engines_cores": round(cores, 3), "settled": False}


# ---------------------------------------------------------------- host noise per phase


class NoiseKeeper:
    """Who is who per engine (resolved once, after its warm-up) and the current phase's noise and energy windows."""

    def __init__(
        self,
        targets: list[Target],
        meters: list[energy.Meter] | None = None,
        say: Callable[[str], None] | None = None,
    ):
        self.targets = targets
        self.say = say or (lambda text: None)  # a phase whose host noise could not be read (once per reason)
        self.unread: dict[str, int] = {}  # why a phase's noise was not read -> how many phases
        self.meters = energy.meters() if meters is None else meters  # found once: the machine does not change
        self.energy = energy.Watch(self.meters)
        self.elsewhere: str | None = None  # why this machine's energy is not the current engine's
        self.roles: dict[str, hostnoise.Roles] = {}
        self.watch: hostnoise.Watch | None = None
        self.instance = ""
        self.last: dict | None = None
        self.settled: dict | None = None  # the settle wait before the current phase, if any

    def settle(
        self, target: Target, max_s: float, *, switched: bool, say: Callable[[str], None], interrupted: Event
    ) -> None:
        """Before every phase: after another engine's phase, wait for the others to go quiet (see `settle`)."""
        roles = self.roles.get(target.instance)
        self.settled = None
        if switched and roles is not None:
            self.settled = settle(roles, max_s, say=say, interrupted=interrupted, instance=target.instance)

    def locate(self, target: Target) -> str:
        """Find the engine's processes on this host; the line says how (or why it could not)."""
        others = [(t.instance, t.url) for t in self.targets if t.instance != target.instance]
        roles = hostnoise.roles_for(target.instance, target.kind, target.url, others)
        self.roles[target.instance] = roles
        return f"host noise for {target.instance}: engine {roles.engine_how}" + (
            f"; other engines: {', '.join(sorted(roles.others))}" if roles.others else ""
        )

    def baseline(self, seconds: float) -> dict | None:
        """How busy the host was before the run: the CPU programs other than the run's engines, servescope's own and
        this load generator used over `seconds` (LOADGEN_HOST_BASELINE_S; said in the Summary, where a protected
        run's phases, kept quiet by the CPU priority, would not show that the host was busy)."""
        if not self.targets or not hostnoise.on_this_host(self.targets[0].url):
            return None
        first = self.targets[0]
        roles = hostnoise.roles_for(first.instance, first.kind, first.url, [(t.instance, t.url) for t in self.targets])
        watch = hostnoise.Watch(roles)
        watch.begin()
        time.sleep(seconds)
        noise = watch.measure()
        if noise is None:
            return None
        outside = [g for g in noise.get("groups", []) if g.get("kind") != hostnoise.OTHER_ENGINE]
        return {"window_s": noise["window_s"], "foreign_cores": sum(g["cores"] for g in outside), "groups": outside[:3]}

    def begin(self, target: Target) -> None:
        self.instance = target.instance
        self.watch = hostnoise.Watch(self.roles.get(target.instance) or hostnoise.Roles())
        self.watch.begin()
        self.last = None
        self.elsewhere = None
        if not hostnoise.on_this_host(target.url):
            self.elsewhere = f"not measured: {target.url} is not on this host (its counters are not read here)"
            self.energy.stop()
        else:
            self.energy.begin()

    def annotate(self, record: PhaseRecord) -> None:
        """Put the noise from the phase's start up to now on a finished phase record (before it is written)."""
        if self.watch is not None:
            self.last = record.noise = self.watch.measure()
            if self.last is not None and self.settled is not None:
                self.last["settle"] = self.settled
            why = self.watch.unread
            if self.last is None and why is not None:
                if why not in self.unread:
                    self.say(f"{record.instance} {record.phase}: {why}: a gap in its noise, the run goes on")
                self.unread[why] = self.unread.get(why, 0) + 1
        if self.elsewhere is not None:  # this machine's counters say nothing of an engine elsewhere
            record.energy = {"joules": None, "reason": self.elsewhere}
        elif (measured := self.energy.measure(go_on=True)) is not None:
            record.energy = measured  # the phase's next record (a burst's next round) starts where this one ended

    def close(self) -> None:
        """The run is over: no window stays open (nor its reads between the edges); the gaps counted."""
        self.energy.stop()
        gaps = sum(self.unread.values())
        if gaps > 1:
            self.say(f"host noise not read for {gaps} phase records: {'; '.join(sorted(self.unread))}")

    def flags(self) -> list[str]:
        return hostnoise.flags(self.last, self.instance)
