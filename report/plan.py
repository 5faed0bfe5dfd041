"""`python -m report plan`: how many replicas a traffic needs, from one replica's knee, and what a good token costs."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from report import energy, load, replicas, traffic, workloads
from report.replicas import Level, Profile
from servescope import engines, knobs, slo
from servescope.engines.base import BATCH_SLOTS
from servescope.runfolder import KNEE, KNEE_CONCURRENCY, RequestRecord, new_run_id

METHOD = (
    "predicted, not measured: a discrete-event model of N replicas behind a router (report/replicas.py), each "
    "request drawing its TTFT and time per token from what one replica's knee measured at the load it meets; "
    "no cache shared across replicas, the traffic's prompts taken to be like the knee's"
)


class PlanError(ValueError):
    """Inputs a plan cannot be made from: one line."""


@dataclass
class Prediction:
    replicas: int
    attainment: float | None  # good / requests over the whole traffic, repetitions pooled
    meets: bool  # every window meets the SLOs
    window_meets: list[bool | None]  # None: no request arrived in that window
    good_tokens: float  # per repetition
    mean_in_flight: float  # requests held per replica over the traffic's span (Little's law: sum of E2E / span)
    peak_in_flight: float  # the same in the busiest window
    beyond: int  # requests that met a replica above the highest measured load (counted as failed)


@dataclass
class PlanRow:
    label: str
    engine: str
    knee: float | None
    replicas: int | None  # the fewest that meet the SLOs in every window; None: more than the search went
    replicas_p95_time: int | None  # the replicas 95% of the windows need (what an autoscaler could follow)
    attainment: float | None
    attainment_one_fewer: float | None
    attainment_slower: float | None  # derived: at that count with the engine PLAN_SLOWER slower than its knee measured
    utilisation: float | None  # mean in flight per replica / the knee's load
    headroom: float | None  # 1 - the busiest window's in flight per replica / the knee's load
    price_per_hour: float | None
    cost_per_million_good_tokens: float | None
    beyond: int
    source: str
    joules_per_good_token: float | None = None  # measured at the knee's load, one replica
    energy_reason: str = ""
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- the knee's replica


def profile_of(path: Path, slots: int | None = None) -> Profile:
    """One replica as its knee run folder measured it: the trusted measurements of each level, pooled; its batch
    slots `slots`, else the setting the run recorded, else not known."""
    path = Path(path)
    try:
        summary = json.loads((path / KNEE).read_text())
    except FileNotFoundError:
        raise PlanError(
            f"{path}: no {KNEE} (a `python -m loadgen knee` run folder is what a plan starts from)"
        ) from None
    except (OSError, ValueError) as exc:
        raise PlanError(f"{path / KNEE}: unreadable ({exc})") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("probes"), list):
        raise PlanError(f"{path / KNEE}: not a knee summary (no probes)")
    try:
        run = load.load(path)
    except load.RunError as exc:
        raise PlanError(str(exc)) from None
    try:
        instance = str(summary.get("instance") or "")
        closed_loop = summary.get("over") == KNEE_CONCURRENCY
        by_level: dict[float, list[RequestRecord]] = {}
        walls: dict[float, float] = {}
        energy_by_level: dict[float, list[energy.Energy]] = {}
        phases = {p.phase: p for p in run.phases_of(instance)}
        for probe in summary["probes"]:
            if not isinstance(probe, dict) or not probe.get("trusted") or probe.get("phase") not in phases:
                continue
            records = run.requests_of(instance, probe["phase"], gaps=False)
            level = float(probe["level"])
            by_level.setdefault(level, []).extend(records)
            ph = phases[probe["phase"]]
            walls[level] = walls.get(level, 0.0) + max(ph.ended_at - ph.started_at, 1e-9)
            energy_by_level.setdefault(level, []).append(energy.of_record(ph))
        levels = []
        for level, records in sorted(by_level.items()):
            busy = sum(r.e2e_s or 0.0 for r in records)
            levels.append(_level(level if closed_loop else busy / walls[level], records))
        levels.sort(key=lambda lv: lv.concurrency)
        ok = [r for recs in by_level.values() for r in recs if r.ok]
        out_tokens = int(np.median([r.output_tokens for r in ok if r.output_tokens])) if ok else 0
        prompt = [r.prompt_tokens for r in ok if r.prompt_tokens]
        info = run.engines.get(instance)
        knee_level = summary.get("knee") if summary.get("knee") in by_level else None
        joules, energy_reason = _energy_at(energy_by_level.get(knee_level), by_level.get(knee_level), summary)
    finally:
        run.close()
    if not levels:
        raise PlanError(f"{path}: {KNEE} has no trusted measurement to model a replica with")
    engine = str(summary.get("engine") or "")
    adapter = engines.ENGINES.get(engine)
    label = adapter.title if adapter else engine or instance
    label += f" ({instance})" if instance and instance != engine else ""
    lever = adapter.lever(BATCH_SLOTS) if adapter else None
    # The setting that sizes a replica's batch, where the run recorded it (this checkout's knobs say nothing of it)
    setting = None
    for name in lever.knob.recorded_as if lever and info else ():
        value, where = info.flag_source(name)
        if where == "run" and value not in (None, "") and not isinstance(value, bool):  # `--slots` alone: a switch
            setting = value
            break
    recorded = setting is not None
    label += f" {lever.flag}={setting}" if recorded else ""
    if slots is None and recorded:
        try:
            slots = int(setting)
        except (TypeError, ValueError):
            slots = None
    knee = summary.get("knee")
    return Profile(
        label=label,
        engine=engine,
        levels=tuple(levels),
        knee=float(knee) if isinstance(knee, (int, float)) and closed_loop else None,
        slots=slots,
        output_tokens=max(out_tokens, 1),
        prompt_tokens=int(np.median(prompt)) if prompt else None,
        joules_per_good_token=joules,
        energy_reason=energy_reason,
    )


def _energy_at(
    measured: list[energy.Energy] | None, records: list[RequestRecord] | None, summary: dict
) -> tuple[float | None, str]:
    """Joules per good output token the knee's own load measured (every measurement of it read, or none counts)."""
    if not measured or not records:
        return None, "not measured: no trusted measurement at the knee's load"
    missing = next((e for e in measured if not e.measured), None)
    if missing is not None:
        return None, missing.text()
    try:
        spec = slo.resolve(summary.get("spec"), summary.get("objective"))
    except slo.SloError:
        return None, "not measured: the knee's SLOs are unreadable"
    good = sum(r.output_tokens or 0 for r in records if spec.good(r))
    return (sum(e.joules for e in measured) / good, "") if good else (None, "not measured: no good token at the knee")


def _level(concurrency: float, records: list[RequestRecord]) -> Level:
    ok = [r for r in records if r.ok and r.ttft_s is not None]
    # TTFT as the SLO judges it: from the schedule's instant where an open-loop knee kept one
    ttft = np.sort([r.ttft_s + slo.schedule_lag(r) for r in ok])
    tpot = np.sort([t for t in (slo.tpot(r) for r in ok) if t is not None])
    failed = 1 - len(ok) / len(records) if records else 1.0
    prefill = [v for v in map(workloads.engine_prefill_ms, ok) if v is not None]
    return Level(concurrency, ttft, tpot, failed, len(records), float(np.median(prefill)) if prefill else None)


# ---------------------------------------------------------------- the model, judged as the knee judged


def predict(
    profile: Profile,
    load: traffic.Traffic,
    n: int,
    spec: slo.SloSpec,
    policy: str,
    repeats: int,
    window_s: float,
    sharing: replicas.Sharing | None = None,
) -> Prediction:
    windows = max(1, math.ceil(load.duration_s / window_s))
    per_window: list[list[RequestRecord]] = [[] for _ in range(windows)]
    beyond = 0
    for seed in range(repeats):
        outcomes = replicas.simulate(load.arrivals, profile, n, policy, seed, sharing)
        for o in outcomes:
            beyond += o.error == replicas.BEYOND
            per_window[min(int(o.at / window_s), windows - 1)].append(_record(profile, o))
    meets: list[bool | None] = []
    peak = 0.0
    for w, records in enumerate(per_window):
        if not records:
            meets.append(None)
            continue
        span = min(window_s, load.duration_s - w * window_s)  # the last window ends with the traffic
        meets.append(slo.evaluate(spec, records, span * repeats).meets)
        # Little's law: requests held = arrival rate x time in the system (E2E), per replica
        peak = max(peak, sum(r.e2e_s or 0.0 for r in records) / (span * repeats * n))
    every = [r for records in per_window for r in records]
    good = [r for r in every if spec.good(r)]
    return Prediction(
        replicas=n,
        attainment=len(good) / len(every) if every else None,
        meets=all(m is not False for m in meets),
        window_meets=meets,
        good_tokens=sum(r.output_tokens or 0 for r in good) / repeats,
        mean_in_flight=sum(r.e2e_s or 0.0 for r in every) / (repeats * n * load.duration_s),
        peak_in_flight=peak,
        beyond=beyond // repeats,
    )


def _record(profile: Profile, o: replicas.Outcome) -> RequestRecord:
    """The outcome as the record slo.evaluate judges (the knee's rule, so the plan cannot judge differently)."""
    return RequestRecord(
        engine=profile.engine,
        instance=f"replica-{o.replica}",
        scenario="plan",
        phase="plan",
        api="openai",
        model="",
        prompt_set="",
        prompt_set_sha256="",
        prompt_id="",
        max_tokens=o.output_tokens,
        started_at=o.at,
        ok=o.ok,
        status=200 if o.ok else 0,
        error=o.error,
        ttft_s=o.ttft_s,
        e2e_s=o.e2e_s,
        output_tokens=o.output_tokens if o.ok else None,
    )


def plan(
    profile: Profile,
    load: traffic.Traffic,
    spec: slo.SloSpec,
    policy: str,
    repeats: int,
    window_s: float,
    max_replicas: int,
    price: float | None,
    sharing: replicas.Sharing | None = None,
    slower: float = 0.0,
) -> tuple[PlanRow, list[Prediction]]:
    """The fewest replicas that meet the SLOs in every window, searched upwards from one; with `slower` above 0, the
    attainment at that count once more with every latency the knee measured that share longer."""
    tried: list[Prediction] = []
    first_meeting: list[int | None] = []
    found: Prediction | None = None
    for n in range(1, max_replicas + 1):
        p = predict(profile, load, n, spec, policy, repeats, window_s, sharing)
        tried.append(p)
        if not first_meeting:
            first_meeting = [None] * len(p.window_meets)
        for w, m in enumerate(p.window_meets):
            if m and first_meeting[w] is None:
                first_meeting[w] = n
        if p.meets:
            found = p
            break
    notes: list[str] = []
    notes.append(
        f"{profile.slots} batch slots a replica, the rest waiting in its queue"
        if profile.slots
        else "batch slots not known (not recorded; --slots): the engine's queueing as the knee measured it"
    )
    if sharing:
        notes.append(
            f"{sharing.per_host} replicas a machine: a replica with a busy neighbour draws from the knee measured "
            "with its neighbours busy"
        )
    if profile.prompt_tokens:
        notes.append(f"knee measured {profile.prompt_tokens}-token prompts, {profile.output_tokens} tokens out")
    row = PlanRow(
        label=profile.label,
        engine=profile.engine,
        knee=profile.knee,
        replicas=found.replicas if found else None,
        replicas_p95_time=None,
        attainment=found.attainment if found else tried[-1].attainment,
        attainment_one_fewer=tried[-2].attainment if found and len(tried) > 1 else None,
        attainment_slower=None,
        utilisation=None,
        headroom=None,
        price_per_hour=price,
        cost_per_million_good_tokens=None,
        beyond=(found or tried[-1]).beyond,
        source="",
        joules_per_good_token=profile.joules_per_good_token,
        energy_reason=profile.energy_reason,
        notes=notes,
    )
    if found is None:
        row.notes.append(f"more than {max_replicas} replicas (PLAN_MAX_REPLICAS): the search stopped there")
        return row, tried
    needed = sorted(
        n or found.replicas for n, m in zip(first_meeting, found.window_meets, strict=True) if m is not None
    )
    row.replicas_p95_time = needed[min(len(needed) - 1, math.ceil(0.95 * len(needed)) - 1)] if needed else None
    if slower > 0:
        # Near saturation the attainment moves steeply with the engine's speed, and a machine's speed moves between
        # measurements: the same count again, every latency the knee measured this much longer.
        factor = 1 + slower
        busy = replicas.Sharing(sharing.per_host, sharing.busy.scaled(factor, factor)) if sharing else None
        p = predict(profile.scaled(factor, factor), load, found.replicas, spec, policy, repeats, window_s, busy)
        row.attainment_slower = p.attainment
        if not p.meets:
            row.notes.append(
                f"{slower:.0%} slower than its knee measured (PLAN_SLOWER), {found.replicas} replica(s) miss the SLOs "
                f"(attainment {_num(p.attainment, '{:.0%}')}): the count sits near the edge"
            )
    if profile.knee:
        row.utilisation = found.mean_in_flight / profile.knee
        row.headroom = 1 - found.peak_in_flight / profile.knee
    if price is not None and found.good_tokens > 0:
        hours = load.duration_s / 3600
        row.cost_per_million_good_tokens = found.replicas * price * hours / (found.good_tokens / 1e6)
    return row, tried


# ---------------------------------------------------------------- command line


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m report plan", description=__doc__)
    p.add_argument("runs", nargs="+", metavar="KNEE_RUN", help="knee run folders (ID under --results, or a path)")
    p.add_argument("--results", type=Path, default=None, help="where run folders live (default: SERVESCOPE_RESULTS)")
    t = p.add_argument_group("traffic (one of; default: the trace PLAN_TRACE names, at PLAN_SPEED)")
    t.add_argument("--trace", metavar="NAME|FILE", help="a trace as `--prompts trace:` reads it (e.g. trace-small)")
    t.add_argument("--rate", type=float, metavar="REQ/S", help="constant arrivals")
    t.add_argument("--poisson", type=float, metavar="REQ/S", help="Poisson arrivals")
    t.add_argument("--prometheus-query", metavar="PROMQL", help="a real service's request rate (req/s) in Prometheus")
    p.add_argument(
        "--speed", type=float, default=None, help="--trace: its clock this many times faster (default PLAN_SPEED)"
    )
    p.add_argument("--duration", type=float, default=600.0, help="--rate / --poisson: seconds of traffic (600)")
    p.add_argument("--prometheus", metavar="URL", default=None, help="--prometheus-query: where (PROMETHEUS_PORT)")
    p.add_argument("--since", type=float, default=3600.0, help="--prometheus-query: seconds back from now (3600)")
    p.add_argument("--step", type=float, default=60.0, help="--prometheus-query: resolution in seconds (60)")
    p.add_argument(
        "--slots",
        type=int,
        metavar="N",
        help="each replica's batch slots (default: the engine setting the run recorded)",
    )
    p.add_argument("--slo", metavar="SPEC", help="SLOs (default: the knees' own, which must agree)")
    p.add_argument("--slo-attainment", metavar="SHARE", help="share of requests that must meet them")
    p.add_argument(
        "--per-host",
        type=int,
        default=1,
        metavar="M",
        help="replicas sharing one machine (default 1: a machine each); needs --busy-knee",
    )
    p.add_argument(
        "--busy-knee",
        action="append",
        default=[],
        metavar="KNEE_RUN",
        help="--per-host: a knee of one replica measured while its neighbours were kept busy, one per KNEE_RUN",
    )
    p.add_argument("--routing", choices=replicas.POLICIES, default=None, help="the router's policy (PLAN_ROUTING)")
    p.add_argument("--price", action="append", default=[], metavar="ENGINE=PER_HOUR", help="price of an instance-hour")
    p.add_argument("--out", type=Path, default=None, help="folder for plan.json and plan.md (default: RESULTS/plan-ID)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        results = args.results or load.results_dir()
        settings = _settings(args)
        profiles = [profile_of(load.resolve(r, results), args.slots) for r in args.runs]
        spec = _spec(args, [load.resolve(r, results) for r in args.runs])
        sharings = _sharings(args, results)
        offered = _traffic(args)
        prices = _prices(args.price)
    except (PlanError, traffic.TrafficError, slo.SloError, load.RunError, ValueError) as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return 2
    print(
        f"plan: {offered.name}: {len(offered.arrivals)} requests over {offered.duration_s:.1f} s "
        f"(mean {offered.mean_rate:.3g} req/s); {spec.describe()}; routing {settings['routing']}, "
        f"{settings['window_s']:g}-s windows, {settings['repeats']} repetition(s)",
        file=sys.stderr,
    )
    rows = []
    for path, profile, sharing in zip(args.runs, profiles, sharings, strict=True):
        row, _ = plan_with(settings, profile, offered, spec, prices.get(profile.engine), sharing)
        row.source = str(path)
        rows.append(row)
    text = render(rows, offered, spec, settings)
    sys.stdout.write(text)
    out = args.out or results / f"plan-{new_run_id()}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        doc = {
            "method": METHOD,
            "traffic": {"name": offered.name, "requests": len(offered.arrivals), "duration_s": offered.duration_s},
            "slo": {"spec": spec.text, "objective": spec.objective},
            "settings": settings,
            "rows": [asdict(r) for r in rows],
        }
        (out / "plan.json").write_text(json.dumps(doc, indent=2) + "\n")
        (out / "plan.md").write_text("# Plan\n\n```\n" + text + "```\n")
    except OSError as exc:
        print(f"plan: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"plan: wrote {out / 'plan.json'} and plan.md", file=sys.stderr)
    return 0


def _settings(args) -> dict[str, Any]:
    return settings_of(args.routing)


def plan_with(
    settings: dict[str, Any],
    profile: Profile,
    load: traffic.Traffic,
    spec: slo.SloSpec,
    price: float | None,
    sharing: replicas.Sharing | None = None,
) -> tuple[PlanRow, list[Prediction]]:
    """`plan` under the model's settings as settings_of gives them."""
    return plan(
        profile,
        load,
        spec,
        settings["routing"],
        settings["repeats"],
        settings["window_s"],
        settings["max_replicas"],
        price,
        sharing,
        settings["slower"],
    )


def settings_of(routing: str | None = None) -> dict[str, Any]:
    """The model's settings: the router's policy (given, else PLAN_ROUTING), windows, repetitions, search limit."""
    routing = routing or knobs.get("PLAN_ROUTING", replicas.LEAST_CONN)
    if routing not in replicas.POLICIES:
        raise PlanError(f"PLAN_ROUTING={routing!r}: expected {' or '.join(replicas.POLICIES)}")
    window_s = float(knobs.get("PLAN_WINDOW_S", "60"))
    if not window_s > 0:
        raise PlanError(f"PLAN_WINDOW_S={window_s:g}: expected seconds above 0")
    repeats, max_replicas = knobs.get_int("PLAN_REPEATS", 3), knobs.get_int("PLAN_MAX_REPLICAS", 64)
    if repeats < 1 or max_replicas < 1:
        raise PlanError("PLAN_REPEATS and PLAN_MAX_REPLICAS: at least 1")
    text = knobs.get("PLAN_SLOWER").strip()
    try:
        slower = float(text)
    except ValueError:
        slower = math.nan
    if not 0 <= slower < 10:
        raise PlanError(f"PLAN_SLOWER={text!r}: expected a share from 0 (off) to under 10, e.g. 0.05")
    return {
        "routing": routing,
        "window_s": window_s,
        "repeats": repeats,
        "max_replicas": max_replicas,
        "slower": slower,
    }


def _sharings(args, results: Path) -> list[replicas.Sharing | None]:
    """One busy knee per knee run when replicas share machines (--per-host above 1), none otherwise."""
    if args.per_host < 1:
        raise PlanError(f"--per-host {args.per_host}: expected at least 1")
    if args.per_host == 1:
        if args.busy_knee:
            raise PlanError("--busy-knee: only with --per-host above 1 (replicas sharing a machine)")
        return [None] * len(args.runs)
    if len(args.busy_knee) != len(args.runs):
        raise PlanError(
            f"--per-host {args.per_host}: give one --busy-knee per knee run ({len(args.runs)}), "
            f"got {len(args.busy_knee)}"
        )
    return [replicas.Sharing(args.per_host, profile_of(load.resolve(r, results), args.slots)) for r in args.busy_knee]


def _spec(args, paths: list[Path]) -> slo.SloSpec:
    if args.slo:
        return slo.resolve(args.slo, args.slo_attainment)
    seen = set()
    for path in paths:
        summary = json.loads((path / KNEE).read_text())
        seen.add((summary.get("spec"), summary.get("objective")))
    if len(seen) > 1:
        raise PlanError("the knees were measured under different SLOs: say which to plan for with --slo")
    text, objective = seen.pop()
    return slo.resolve(text, args.slo_attainment or objective)


def _traffic(args) -> traffic.Traffic:
    given = [x for x in (args.trace, args.rate, args.poisson, args.prometheus_query) if x is not None]
    if len(given) > 1:
        raise PlanError("say the traffic once: one of --trace, --rate, --poisson, --prometheus-query")
    if not given:
        return default_traffic(args.speed)
    if args.trace is not None:
        return traffic.trace(args.trace, default_speed() if args.speed is None else args.speed)
    if args.rate is not None:
        return traffic.constant(args.rate, args.duration)
    if args.poisson is not None:
        return traffic.poisson(args.poisson, args.duration)
    from report.gauges import default_prometheus_url

    return traffic.prometheus(args.prometheus or default_prometheus_url(), args.prometheus_query, args.since, args.step)


def _prices(given: list[str]) -> dict[str, float]:
    """ENGINE=PRICE pairs: PLAN_PRICE_PER_HOUR's, then --price's over them."""
    pairs = [p for p in knobs.get("PLAN_PRICE_PER_HOUR", "").split(",") if p.strip()] + given
    prices: dict[str, float] = {}
    for pair in pairs:
        engine, sep, value = pair.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not sep or engine.strip() not in engines.ENGINES or not (price >= 0 and math.isfinite(price)):
            raise PlanError(
                f"price {pair!r}: expected ENGINE=PRICE_PER_HOUR, ENGINE one of {', '.join(engines.ENGINES)}"
            )
        prices[engine.strip()] = price
    return prices


COLUMNS = (
    "engine / setting",
    "knee",
    "replicas",
    "p95 time",
    "attain",
    "at N-1",
    "slower",
    "util",
    "headroom",
    "$/M good tok",
    "J/good tok",
)
COLUMNS_HELP = (
    "replicas: the fewest meeting the SLOs in every window; p95 time: what 95% of the windows need; attain: "
    "predicted SLO attainment at that count and at one fewer; slower: at that count with the engine PLAN_SLOWER slower than "
    "its knee measured (derived: near saturation a few percent of speed moves it many points); util: mean requests held (running or queued) per replica over the "
    "knee's load; headroom: what the busiest window leaves of it; $/M good tok: replicas x price x hours over the "
    "good output tokens (PLAN_PRICE_PER_HOUR or --price); J/good tok: measured, the machine's energy over the "
    "good output tokens at the knee's load (docs/energy.md), not modelled"
)


def cells(r: PlanRow, max_replicas: int) -> list[str]:
    """One plan row as the table shows it, in COLUMNS' order (the terminal and the report share it)."""
    return [
        r.label,
        _num(r.knee, "{:g} u"),
        _num(r.replicas, "{:d}", f">{max_replicas}"),
        _num(r.replicas_p95_time, "{:d}"),
        _num(r.attainment, "{:.0%}"),
        _num(r.attainment_one_fewer, "{:.0%}"),
        _num(r.attainment_slower, "{:.0%}"),
        _num(r.utilisation, "{:.0%}"),
        _num(r.headroom, "{:.0%}"),
        _num(r.cost_per_million_good_tokens, "{:.3g}", "not priced" if r.price_per_hour is None else "-"),
        _num(r.joules_per_good_token, "{:.3g}", "not measured"),
    ]


def row_notes(rows: list[PlanRow]) -> list[str]:
    """What each row rests on and where it stops, as `label: note` lines."""
    out: list[str] = []
    for r in rows:
        if r.beyond:
            out.append(f"{r.label}: {r.beyond} request(s) met a replica above the highest load its knee measured")
        out.extend(f"{r.label}: {n}" for n in r.notes)
        if r.joules_per_good_token is None and r.energy_reason:
            out.append(f"{r.label}: energy {r.energy_reason}")
    return out


WIDTHS = (34, 6, 8, 8, 7, 7, 7, 5, 8, 12, 12)


def render(rows: list[PlanRow], offered: traffic.Traffic, spec: slo.SloSpec, settings: dict[str, Any]) -> str:
    def line(values: list[str]) -> str:
        first = f"{values[0][: WIDTHS[0]]:<{WIDTHS[0]}}"
        return " ".join([first, *(f"{v:>{w}}" for v, w in zip(values[1:], WIDTHS[1:], strict=True))])

    lines = [f"plan for {offered.name}, {spec.describe()}:", line(list(COLUMNS))]
    lines.extend(line(cells(r, settings["max_replicas"])) for r in rows)
    lines.append(f"note: {METHOD}.")
    lines.append(f"note: {COLUMNS_HELP}.")
    lines.extend(f"note: {n}" for n in row_notes(rows))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the report's section on a knee run


def default_speed() -> float:
    speed = float(knobs.get("PLAN_SPEED", "1"))
    if not (speed > 0 and math.isfinite(speed)):
        raise PlanError(f"PLAN_SPEED={speed:g}: expected a factor above 0")
    return speed


def default_traffic(speed: float | None = None) -> traffic.Traffic:
    """The traffic a plan is made for when none is said: the trace PLAN_TRACE names, its clock PLAN_SPEED faster."""
    name = knobs.get("PLAN_TRACE", "").strip()
    if not name:
        raise PlanError("say the traffic: one of --trace, --rate, --poisson, --prometheus-query (PLAN_TRACE is empty)")
    return traffic.trace(name, default_speed() if speed is None else speed)


def for_report(path: Path, spec: slo.SloSpec) -> tuple[dict[str, Any], list[PlanRow]] | None:
    """The plan a knee run's report shows (its JSON and its row): this knee, the default traffic, the report's
    SLOs; None on other runs. What cannot be planned (bad knobs, a knee without levels) is ({"not_planned": why}, [])."""
    if not (path / KNEE).is_file():
        return None
    try:
        settings = settings_of()
        offered = default_traffic()
        profile = profile_of(path)
        price = _prices([]).get(profile.engine)
        row, _ = plan_with(settings, profile, offered, spec, price)
    except (PlanError, traffic.TrafficError, ValueError) as exc:
        return {"not_planned": str(exc)}, []
    row.source = str(path)
    doc = {
        "method": METHOD,
        "traffic": {"name": offered.name, "requests": len(offered.arrivals), "duration_s": offered.duration_s},
        "slo": {"spec": spec.text, "objective": spec.objective},
        "settings": settings,
        "rows": [asdict(row)],
    }
    return doc, [row]


def _num(value: Any, form: str, missing: str = "-") -> str:
    return missing if value is None else form.format(value)
