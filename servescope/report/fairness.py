"""Fairness warnings: what makes two engines' (or two phases') numbers not comparable, said before the numbers."""

from __future__ import annotations

import re

from servescope import engines
from servescope.engines.base import BATCH_SLOTS
from servescope.report.load import EngineInfo, Run
from servescope.report.table import TableRow
from servescope.text import words


def _short(sha: str) -> str:
    return sha[:12] if sha else "no hash"


def warnings(run: Run, rows: list[TableRow]) -> list[str]:
    out: list[str] = []
    instances = list(run.engines)

    # Different prompt sets across engines, per scenario: the reference page's matched-set rule across engines.
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
        adapter = engines.ENGINES.get(info.kind)
        lever = adapter.lever(BATCH_SLOTS) if adapter is not None and adapter.queue_means_slots else None
        if not bursts or lever is None:
            continue
        size = max(p.concurrency for p in bursts)
        knob, (value, source) = lever.env, info.flag_source(*lever.knob.recorded_as)
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
                f"{info.title}: burst of {size} > {knob}={slots}{where}: {words.count(size - slots, 'request')} wait in the "
                f"engine's own queue, so its burst shape reflects that setting as much as the engine"
            )

    weights = weights_warning(run)
    if weights:
        out.append(weights)

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

    chunked, failed = run.con.execute(
        "SELECT count(*) FILTER (WHERE ok AND tokens_source = 'chunks'), count(*) FILTER (WHERE NOT ok) FROM requests"
    ).fetchone()
    if chunked:
        out.append(
            f"{words.count(chunked, 'request')} counted output tokens from chunks (no usage/eval_count): tokens/s is approximate"
        )
    if failed:
        out.append(
            f"{failed} of {words.count(run.request_count, 'request')} failed: counted in the table and the latency section, "
            f"left out of latency percentiles"
        )
    return out


# Spellings of one precision across engines: vLLM's --dtype, GGUF file types, Ollama's quantization level.
_PRECISION_ALIASES = {
    "fp32": "float32",
    "f32": "float32",
    "float": "float32",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
}
# A GGUF names its file type before the extension: SmolLM2-135M-Instruct.Q4_1.gguf, model-IQ3_XS.gguf, x.F16.gguf.
_GGUF_TYPE = re.compile(r"[-._](I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32)\.gguf$", re.IGNORECASE)


def precision(info: EngineInfo) -> tuple[str | None, str]:
    """The precision an engine served its weights at, and where that came from (for the reader to judge)."""
    if info.quantization:
        return info.quantization, "recorded"
    dtype, source = info.flag_source("dtype", "VLLM_DTYPE")
    if dtype:
        return str(dtype), "--dtype" + ("" if source == "run" else ", per this checkout's knobs")
    ftype, _ = info.flag_source("model_ftype", "ftype")
    if ftype:
        return str(ftype), "the engine's model_ftype"
    for name in (info.weights, info.model):
        match = _GGUF_TYPE.search(name or "")
        if match:
            return match.group(1), f"the GGUF file name {name.rsplit('/', 1)[-1]}"
    return None, "not recorded"


def _same_precision(a: str | None, b: str | None) -> bool:
    norm = [_PRECISION_ALIASES.get(x.lower(), x.lower()) if x else None for x in (a, b)]
    return norm[0] is not None and norm[0] == norm[1]


def weights_warning(run: Run) -> str | None:
    """Different models, or one model at different precisions (vLLM's float32 beside llama.cpp's Q4_1 of it)."""
    engines = run.engines
    if len(engines) < 2:
        return None
    models = {i: e.model for i, e in engines.items()}
    if len(set(models.values())) > 1 or not next(iter(models.values())):
        described = "; ".join(
            f"{i}: " + " ".join(x for x in (e.model, e.quantization, e.weights) if x) for i, e in engines.items()
        )
        return (
            f"different weights across engines ({described or 'unknown'}): absolute speeds compare models "
            f"as much as engines"
        )
    model = next(iter(models.values()))
    found = {i: precision(e) for i, e in engines.items()}
    values = [p for p, _ in found.values()]
    if all(_same_precision(values[0], v) for v in values[1:]):
        return None
    described = "; ".join(f"{i}: {p or 'unknown'} ({where})" for i, (p, where) in found.items())
    if None in values:
        return (
            f"same model ({model}) but its precision is not recorded for every engine ({described}): if the "
            f"precisions differ, absolute speeds compare them as much as the engines"
        )
    return (
        f"same source weights ({model}) at different precisions ({described}): absolute speeds compare the "
        f"precisions (and their kernels) as much as the engines"
    )


def _truthy(value) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "on")
