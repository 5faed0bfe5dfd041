"""Fairness warnings: what makes two engines' (or two phases') numbers not comparable, said before the numbers."""

from __future__ import annotations

from report.load import Run
from report.table import TableRow


def _short(sha: str) -> str:
    return sha[:12] if sha else "no hash"


def warnings(run: Run, rows: list[TableRow]) -> list[str]:
    out: list[str] = []
    instances = list(run.engines)

    # Different prompt sets across engines, per scenario: the seed's matched-set rule across engines.
    for scenario in dict.fromkeys(p.scenario for p in run.phases):
        sets = {
            i: {(p.prompt_set, p.prompt_set_sha256) for p in run.phases_of(i) if p.scenario == scenario}
            for i in instances
        }
        sets = {i: s for i, s in sets.items() if s}
        if len(sets) > 1 and len({frozenset(s) for s in sets.values()}) > 1:
            described = "; ".join(
                f"{i}: " + ", ".join(f"{n or '?'} ({_short(h)})" for n, h in sorted(s)) for i, s in sets.items()
            )
            out.append(
                f"different prompt sets across engines in the {scenario} phases ({described}): "
                f"their {scenario} numbers are not a like-for-like comparison"
            )

    # Within an engine: the table refuses the scaling factor; say it up front too.
    for row in rows:
        if row.refusal:
            out.append(f"{row.title} {row.phase}: no scaling factor, {row.refusal}")

    # Different max_tokens across engines or across one engine's phases.
    per_engine = {i: sorted({p.max_tokens for p in run.phases_of(i)}) for i in instances}
    per_engine = {i: m for i, m in per_engine.items() if m}
    all_max = sorted({m for ms in per_engine.values() for m in ms})
    if len(all_max) > 1:
        described = "; ".join(f"{i}: {', '.join(map(str, m))}" for i, m in per_engine.items())
        out.append(f"different max_tokens ({described}): generation lengths differ, so tokens/s and E2E are skewed")

    # Bursts larger than the slots of one-at-a-time engines.
    for i, info in run.engines.items():
        bursts = [p for p in run.phases_of(i) if p.scenario == "burst"]
        if not bursts or info.kind not in ("ollama", "llamacpp"):
            continue
        size = max(p.concurrency for p in bursts)
        if info.kind == "ollama":
            knob, (value, source) = "OLLAMA_NUM_PARALLEL", info.flag_source("OLLAMA_NUM_PARALLEL", "num_parallel")
        else:
            knob, (value, source) = (
                "LLAMACPP_PARALLEL",
                info.flag_source("parallel", "np", "LLAMACPP_PARALLEL", "n_parallel", "total_slots", "slots"),
            )
        try:
            slots = int(value) if value is not None else None
        except (TypeError, ValueError):
            slots = None
        if slots is None:
            out.append(
                f"{info.title}: burst of {size} but the manifest does not record {knob}: "
                f"if it is below {size}, requests queued inside the engine"
            )
        elif size > slots:
            where = "" if source == "run" else " (per this checkout's knobs; the run did not record it)"
            out.append(
                f"{info.title}: burst of {size} > {knob}={slots}{where}: {size - slots} request(s) wait in the "
                f"engine's own queue, so its burst shape reflects that setting as much as the engine"
            )

    # Different weights.
    models = {i: (e.model, e.quantization, e.weights) for i, e in run.engines.items()}
    if len({m for m in models.values()}) > 1:
        described = "; ".join(f"{i}: " + " ".join(x for x in m if x) for i, m in models.items())
        out.append(
            f"different weights across engines ({described or 'unknown'}): absolute speeds compare models "
            f"as much as engines"
        )

    # ignore_eos on some engines only.
    eos = {
        i: e.ignore_eos if e.ignore_eos is not None else _truthy(e.flag("ignore_eos", "ignore-eos"))
        for i, e in run.engines.items()
    }
    if len(instances) > 1 and len(set(eos.values())) > 1:
        described = ", ".join(f"{i}={'on' if v else ('off' if v is False else 'unknown')}" for i, v in eos.items())
        out.append(
            f"ignore_eos is not applied alike ({described}): one engine may stop early while another "
            f"always generates max_tokens"
        )

    chunked = sum(1 for r in run.requests if r.ok and r.tokens_source == "chunks")
    if chunked:
        out.append(
            f"{chunked} request(s) counted output tokens from chunks (no usage/eval_count): tokens/s is approximate"
        )
    failed = sum(1 for r in run.requests if not r.ok)
    if failed:
        out.append(
            f"{failed} of {len(run.requests)} request(s) failed: counted in the table and the latency section, "
            f"left out of latency percentiles"
        )
    return out


def _truthy(value) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "on")
