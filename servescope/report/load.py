"""Opens one run folder (manifest, requests.jsonl, phases.jsonl) as a Run: its records held by the analytic engine."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servescope import engines
from servescope.contracts import knobs
from servescope.contracts.runfolder import (
    KNEE,
    MANIFEST,
    MAX_EPOCH_S,
    PHASES,
    REQUESTS,
    PhaseRecord,
    RequestRecord,
    RunFolder,
    latest,
)
from servescope.contracts.runreader import RunData, UnreadableRun
from servescope.report import query
from servescope.text import words


class RunError(Exception):
    """A user-facing problem with the run folder: one line, no traceback."""


@dataclass
class EngineInfo:
    """What the manifest says about one engine instance (every field optional in practice)."""

    instance: str
    kind: str
    url: str = ""
    version: str = ""
    model: str = ""
    quantization: str = ""
    weights: str = ""  # a file name or digest identifying the weights, to spot "different weights"
    ignore_eos: bool | None = None  # False also when the engine cannot honour it ("unavailable")
    flags: dict[str, Any] = field(default_factory=dict)  # recorded in the run: flags, then the engine's settings
    knob_flags: dict[str, Any] = field(default_factory=dict)  # this checkout's knobs, used only when not recorded
    # An engine the stack proxies (Ollama): "proxy" when the run's requests went through servescope's proxy, "direct"
    # when not (its running/waiting then observed none of them), "" when the run did not record it.
    route: str = ""

    @property
    def title(self) -> str:
        kind = engines.ENGINES.get(self.kind)
        base = kind.title if kind else self.kind
        return base if self.instance == self.kind else f"{base} ({self.instance})"

    def flag(self, *names: str) -> Any:
        """The first flag present under any of the given spellings (CLI flag, knob, or snake_case)."""
        return self.flag_source(*names)[0]

    def flag_source(self, *names: str) -> tuple[Any, str | None]:
        """(value, "run") when the run recorded it, (value, "knobs") from this checkout's knobs, else (None, None)."""
        wanted = {_norm(n) for n in names}
        for source, flags in (("run", self.flags), ("knobs", self.knob_flags)):
            for key, value in flags.items():
                if _norm(key) in wanted:
                    return value, source
        return None, None


@dataclass
class Run:
    """One run folder, its records held by the analytic engine (db): ask it questions rather than list records."""

    path: Path
    run_id: str
    manifest: dict[str, Any]
    db: RunData  # views requests and phases (the accepted records, servescope.contracts.runreader)
    request_count: int
    phases: list[PhaseRecord]
    engines: dict[str, EngineInfo]  # by instance, in manifest order then first appearance
    started_at: float | None = None  # the manifest's, else the first send
    ended_at: float | None = None  # the manifest's, else the last phase end or request finish
    warnings: list[str] = field(default_factory=list)  # what the loader skipped or guessed
    phases_reconstructed: bool = False  # no phase record was read: the phases are guessed from the requests
    cache: dict[Any, Any] = field(default_factory=dict, repr=False)  # answers worth computing once (pools)

    view: Any = field(default=None, repr=False)  # a cursor whose `requests` leaves some phases out (Run.without)

    @property
    def con(self):
        return self.view if self.view is not None else self.db.con

    def without(self, dropped: list[tuple[str, str]], phases: list[PhaseRecord]) -> Run:
        """The same run without some (instance, phase) pairs and their requests: a cursor of its own whose
        `requests` view leaves them out (a temporary view, seen by that cursor only)."""
        if not dropped:
            return self  # nothing left out: the same phases, the same requests
        cursor = self.db.con.cursor()
        cursor.execute("CREATE TEMP TABLE dropped (instance VARCHAR, phase VARCHAR)")
        cursor.executemany("INSERT INTO dropped VALUES (?, ?)", dropped)
        database = cursor.execute("SELECT current_database()").fetchone()[0]
        cursor.execute(
            f'CREATE TEMP VIEW requests AS SELECT r.* FROM "{database}".main.requests r '
            f"ANTI JOIN dropped d USING (instance, phase)"
        )
        count = cursor.execute("SELECT count(*) FROM requests").fetchone()[0]
        return dataclasses.replace(self, phases=phases, view=cursor, request_count=count, cache={})

    def requests_of(self, instance: str, phase: str | None = None, gaps: bool = True) -> list[RequestRecord]:
        """One engine's records (one phase's) as objects, in the report's order: for small selections only.
        gaps=False leaves every itl_s empty (for readers that never look at the gaps: a tenth of the memory)."""
        where = "instance = ?" + (" AND phase = ?" if phase is not None else "")
        params = [instance] + ([phase] if phase is not None else [])
        skip = () if gaps else ("itl_s",)
        return list(
            self.db.records("requests", RequestRecord, where, params, order=query.ORDER, con=self.con, skip=skip)
        )

    def phases_of(self, instance: str) -> list[PhaseRecord]:
        return [p for p in self.phases if p.instance == instance]

    def close(self) -> None:
        self.db.close()


def knee_of(run: Run) -> dict[str, Any] | None:
    """The run's knee.json (a knee or quick run), None for any other run or one that cannot be read."""
    path = run.path / KNEE
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None


def results_dir() -> Path:
    """Where run folders live: SERVESCOPE_RESULTS, a relative one where the load generator writes it (under the
    checkout whatever the working directory; knobs.under_root)."""
    try:
        path = knobs.path("SERVESCOPE_RESULTS")
    except (KeyError, ValueError):
        path = Path("results")
    return knobs.under_root(path)


def resolve(arg: str | None, results_dir: Path) -> Path:
    """--run ID|PATH (or nothing: the latest run under results_dir) -> the run folder's path."""
    if arg is None:
        try:
            return latest(results_dir).path
        except FileNotFoundError as exc:
            raise RunError(str(exc)) from None
    try:
        candidate = Path(arg).expanduser()
    except RuntimeError:  # ~user of no such user: "Could not determine home directory."
        raise RunError(f"--run {arg!r}: no such user's home directory to expand ~ in") from None
    for path in (candidate, Path(results_dir) / arg):
        if path.is_dir():
            return path
    raise RunError(f"no run folder {arg!r} (looked for the path and under {results_dir})")


def load(path: Path, limits_of: Callable[[dict[str, Any]], tuple[float, ...]] | None = None) -> Run:
    """Load a run folder; skips what it cannot read and records why in Run.warnings (one line per reason).
    limits_of: the gap limits worth counting while the records are read (servescope.contracts.runreader), from the manifest."""
    path = Path(path)
    warnings: list[str] = []
    folder = RunFolder(path)
    if not (path / MANIFEST).exists() and not (path / REQUESTS).exists():
        raise RunError(f"{path} is not a run folder (no {MANIFEST}, no {REQUESTS})")
    manifest = _manifest(folder, warnings)
    warnings += _distributed_warnings(manifest)
    try:
        db = RunData(path, limits=limits_of(manifest) if limits_of else ())
    except UnreadableRun as exc:
        raise RunError(str(exc)) from None
    warnings += db.skips.lines()
    con = db.con
    request_count = con.execute("SELECT count(*) FROM requests").fetchone()[0]
    phases = list(db.records("phases", PhaseRecord))
    reconstructed = bool(request_count and not phases)
    if reconstructed:
        phases = _phases_from_requests(con)
        warnings.append(f"no {PHASES}: phases reconstructed from requests (wall = first send to last finish)")
    phases.sort(key=lambda p: (p.started_at, p.instance))
    run_engines = _engines(manifest, con, phases, warnings)
    run_id = str(manifest.get("run_id") or path.name)
    first, last = con.execute("SELECT min(started_at), max(started_at + coalesce(e2e_s, 0)) FROM requests").fetchone()
    starts = [p.started_at for p in phases] + ([first] if first is not None else [])
    ends = [p.ended_at for p in phases] + ([last] if last is not None else [])
    started_at = _as_float(manifest.get("started_at"))
    ended_at = _as_float(manifest.get("ended_at"))
    return Run(
        path,
        run_id,
        manifest,
        db,
        request_count,
        phases,
        run_engines,
        started_at if started_at is not None else (min(starts) if starts else None),
        ended_at if ended_at is not None else (max(ends) if ends else None),
        warnings,
        phases_reconstructed=reconstructed,
    )


def _manifest(folder: RunFolder, warnings: list[str]) -> dict[str, Any]:
    """The manifest as a dict; a missing or unreadable one costs the setup details, never the records."""
    if not (folder.path / MANIFEST).exists():
        warnings.append(f"no {MANIFEST} in {folder.path}: setup section limited to what the records say")
        return {}
    try:
        manifest = folder.manifest()
    except (ValueError, OSError, RecursionError) as exc:
        problem = f"unreadable ({exc})"
    else:
        if isinstance(manifest, dict):
            return manifest
        problem = "not a JSON object"
    if not (folder.path / REQUESTS).exists():
        raise RunError(f"{folder.path / MANIFEST}: {problem}, and no {REQUESTS} to report on")
    warnings.append(f"{MANIFEST}: {problem}: setup section limited to what the records say")
    return {}


def _distributed_warnings(manifest: dict[str, Any]) -> list[str]:
    """What the load generator's master says of its workers (loadgen/distributed.py): requests a lost worker never
    sent, messages its port dropped, clock steps. Each one line; anything malformed in it is passed over."""
    out: list[str] = []
    distributed = manifest.get("distributed")
    distributed = distributed if isinstance(distributed, dict) else {}
    unsent = distributed.get("unsent")
    for phase, count in unsent.items() if isinstance(unsent, dict) else ():
        if isinstance(count, int) and count > 0:
            sent = words.noun(count, "was", "were")
            out.append(
                f"{phase}: {words.count(count, 'request')} {sent} never sent (a load generator worker was lost in it)"
            )
    dropped = distributed.get("dropped_messages")
    total = sum(n for n in dropped.values() if isinstance(n, int)) if isinstance(dropped, dict) else 0
    if total:
        out.append(
            f"load generator workers' port: {words.count(total, 'message')} dropped (not from this run's workers, or "
            "malformed)"
        )
    workers = manifest.get("workers")
    for worker in workers if isinstance(workers, list) else ():
        if not isinstance(worker, dict):
            continue
        steps = [s for s in worker.get("clock_steps_s") or () if isinstance(s, (int, float))]
        moved = worker.get("records_put_on_master_clock")
        moved = moved if isinstance(moved, int) else 0
        if steps or moved:
            said = [f"its clock stepped {', '.join(f'{s:+.3f}' for s in steps)} s"] if steps else []
            said += [f"{words.count(moved, 'record')} put on the master's clock as they arrived"] if moved else []
            out.append(f"load generator worker {worker.get('index')}: {'; '.join(said)}")
    return out


def _phases_from_requests(con) -> list[PhaseRecord]:
    """One phase per (instance, phase) the requests name: first send to last finish, first record's settings."""
    first = f"ORDER BY {query.ORDER}"
    rows = con.execute(
        f"SELECT first(engine {first}), instance, first(scenario {first}), phase, min(started_at), "
        f"max(started_at + coalesce(e2e_s, 0)), count(*), first(prompt_set {first}), "
        f"first(prompt_set_sha256 {first}), first(max_tokens {first}) "
        f"FROM requests GROUP BY instance, phase ORDER BY min(started_at)"
    ).fetchall()
    return [
        PhaseRecord(engine, instance, scenario, phase, start, end, n, n if scenario == "burst" else 1, ps, sha, mt)
        for engine, instance, scenario, phase, start, end, n, ps, sha, mt in rows
    ]


def _engines(manifest: dict[str, Any], con, phases: list[PhaseRecord], warnings: list[str]) -> dict[str, EngineInfo]:
    """Normalise the manifest's engine entries (a list or a dict keyed by instance) into EngineInfo."""
    raw = manifest.get("engines") or []
    entries: list[tuple[str | None, dict[str, Any]]] = []
    if isinstance(raw, dict):
        entries = [(str(k), v) for k, v in raw.items() if isinstance(v, dict)]
    elif isinstance(raw, list):
        entries = [(None, v) for v in raw if isinstance(v, dict)]
    found: dict[str, EngineInfo] = {}
    for key, entry in entries:
        instance = str(
            entry.get("instance") or entry.get("name") or key or entry.get("kind") or entry.get("engine") or ""
        )
        if not instance:
            warnings.append(f"{MANIFEST}: an engine entry has no name, ignored")
            continue
        kind = str(entry.get("kind") or entry.get("engine") or instance.split(":")[0])
        flags = entry.get("flags") or entry.get("knobs") or entry.get("args") or {}
        if isinstance(flags, list):  # a command line: --max-num-seqs 8 -> {"--max-num-seqs": "8"}
            flags = _flags_from_argv([str(a) for a in flags])
        flags = dict(flags) if isinstance(flags, dict) else {}
        settings = entry.get("settings")  # what the engine said about itself (loadgen's probe)
        if isinstance(settings, dict):
            flags.update({k: v for k, v in settings.items() if k not in flags and not isinstance(v, (dict, list))})
        eos = entry.get("ignore_eos")
        model = entry.get("model") or ""
        if isinstance(model, dict):
            model = model.get("name") or model.get("id") or json.dumps(model, sort_keys=True)
        found[instance] = EngineInfo(
            instance=instance,
            kind=kind,
            url=str(entry.get("url") or ""),
            version=str(entry.get("version") or ""),
            model=str(model),
            quantization=str(entry.get("quantization") or entry.get("quant") or ""),
            weights=str(
                entry.get("weights_sha256")
                or entry.get("weights")
                or entry.get("model_digest")
                or entry.get("digest")
                or flags.get("model_path")
                or ""
            ),
            ignore_eos=eos if isinstance(eos, bool) else (False if eos == "unavailable" else None),
            flags=flags,
            route=entry.get("route") if entry.get("route") in ("proxy", "direct") else "",
        )
    # Instances the records name but the manifest does not: phases first, then requests, as they appear.
    seen = [(p.instance, p.engine, "", p.started_at) for p in phases] + con.execute(
        f"SELECT instance, first(engine ORDER BY {query.ORDER}), first(model ORDER BY {query.ORDER}), min(started_at) "
        f"FROM requests GROUP BY instance ORDER BY min(({query.ORDER}))"
    ).fetchall()
    for instance, kind, model, _ in seen:
        if instance not in found:
            found[instance] = EngineInfo(instance=instance, kind=kind, model=model)
    for info in found.values():
        info.knob_flags = _knob_flags(info.kind)
    if isinstance(raw, dict):
        # write_manifest sorts keys, so a dict's order says nothing: use the order the engines ran in.
        first: dict[str, float] = {}
        for instance, _, _, start in seen:
            first[instance] = min(first.get(instance, start), start)
        found = dict(sorted(found.items(), key=lambda kv: first.get(kv[0], float("inf"))))
    return found


def _knob_flags(kind: str) -> dict[str, Any]:
    """The knobs `make up` starts the engine with (its adapter's stack_knobs): the report falls back on them (and says
    so) when a run folder does not record the setting, since the engines do not report it over their APIs."""
    adapter = engines.ENGINES.get(kind)
    try:
        values = knobs.load()
    except (OSError, ValueError):
        return {}
    return {k: values[k] for k in (adapter.stack_knobs if adapter else ()) if k in values}


def _flags_from_argv(argv: list[str]) -> dict[str, Any]:
    flags: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-"):
            if "=" in arg:
                key, value = arg.split("=", 1)
                flags[key] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                flags[arg] = argv[i + 1]
                i += 1
            else:
                flags[arg] = True
        i += 1
    return flags


def _norm(name: str) -> str:
    return name.lstrip("-").replace("-", "_").lower()


def _as_float(value: Any) -> float | None:
    """A manifest's instant, or None when it is not one a record could hold (runfolder's epoch bounds)."""
    try:
        number = float(value) if value is not None else None
    except (TypeError, ValueError, OverflowError):
        return None
    return number if number is not None and 0 <= number <= MAX_EPOCH_S else None
