"""Energy per load phase from the machine's own counters: Linux RAPL (powercap sysfs) and NVIDIA's, or why not.

Two reads per phase, at its edges (as servescope/host/hostnoise.py reads the CPU), never an estimate:

  intel-rapl   /sys/class/powercap/intel-rapl:N (one per CPU package; AMD's driver uses the same names), each
               zone's `energy_uj` (a counter in microjoules) wrapping at `max_energy_range_uj`. Its sub-zones
               (intel-rapl:N:M) split the package: `core` and `uncore` are inside it and are not added again;
               `dram` is the one sub-zone RAPL measures outside the package, so it is added. `psys` (the whole
               platform, on laptops) holds the packages: read only where no package zone is. An intel-rapl-mmio
               zone reads a package the MSR zone already reads: added only when no zone of that name was.
  nvidia-smi   `total_energy_consumption` of every GPU, in mJ since the driver loaded; only where the binary is
               on PATH.

A phase's record (PhaseRecord.energy) holds the joules of each source that could be read, with its zones, and
the reason for each that could not; `joules` is null when none could ("not measured: ..."). The counters are the
machine's: everything that ran during the phase is in them (the host noise says what else did).
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

POWERCAP = Path("/sys/class/powercap")
NVIDIA_SMI = "nvidia-smi"
NVIDIA_QUERY = ("--query-gpu=index,total_energy_consumption", "--format=csv,noheader,nounits")
NVIDIA_TIMEOUT_S = 5.0
RAPL, GPU = "intel-rapl", "nvidia-smi"
_ZONE = re.compile(r"^(intel-rapl(?:-mmio)?):(\d+)(?::(\d+))?$")
OUTSIDE_PARENT = ("dram",)  # sub-zones whose energy the package's counter does not hold
PLATFORM = "psys"
TICK_S = 10.0  # RAPL is read this often between a phase's edges: a package's 262 kJ range would take 26 kW to pass

ReadText = Callable[[Path], str]


def _read_text(path: Path) -> str:
    return path.read_text(encoding="ascii")


@dataclass(frozen=True)
class Zone:
    """One counter: a RAPL zone or a GPU."""

    key: str  # "intel-rapl:0", "intel-rapl:0:0", "gpu0"
    name: str  # the zone's own name ("package-0", "dram") or "gpu0"
    path: Path | None = None  # the zone's directory (RAPL)
    wrap_uj: int | None = None  # the counter returns to 0 past this (max_energy_range_uj); None: it does not wrap
    max_power_uw: int | None = None  # the zone's highest power (max_power_range_uw): bounds how fast it can wrap


@dataclass
class Reading:
    """One read of a source's counters, or why it could not be read."""

    source: str
    mono: float
    counters_uj: dict[str, int] = field(default_factory=dict)  # by Zone.key
    zones: dict[str, Zone] = field(default_factory=dict)
    reason: str | None = None  # "not measured: ..." when nothing could be read


class Meter(Protocol):
    source: str
    wraps: bool  # its counter returns to 0 (read between a phase's edges too: Watch)

    def read(self) -> Reading: ...


# ---------------------------------------------------------------- RAPL


def _int_file(path: Path, read_text: ReadText) -> int | None:
    try:
        return int(read_text(path).strip())
    except (OSError, ValueError):
        return None


def _zone_dirs(root: Path) -> dict[str, Path]:
    """Zone directories by name: /sys/class/powercap lists every zone flat (symlinks); a tree copied without the
    links holds the sub-zones inside their parent."""
    found: dict[str, Path] = {}
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return found
    for name in entries:
        if _ZONE.match(name) and (root / name).is_dir():
            found.setdefault(name, root / name)
            try:
                children = sorted(os.listdir(root / name))
            except OSError:
                continue
            for child in children:
                if _ZONE.match(child) and (root / name / child).is_dir():
                    found.setdefault(child, root / name / child)
    return found


def counted_zones(root: Path = POWERCAP, read_text: ReadText = _read_text) -> list[Zone]:
    """The zones whose energies add up to the machine's without counting any joule twice (the module's rule)."""
    top: list[Zone] = []
    outside: list[Zone] = []
    for key, path in _zone_dirs(root).items():
        m = _ZONE.match(key)
        try:
            name = read_text(path / "name").strip()
        except OSError:
            name = key
        zone = Zone(
            key,
            name,
            path,
            _int_file(path / "max_energy_range_uj", read_text),
            _int_file(path / "max_power_range_uw", read_text),
        )
        if m.group(3) is None:
            top.append(zone)
        elif name in OUTSIDE_PARENT:
            outside.append(zone)
    msr = [z for z in top if z.key.startswith(RAPL + ":")]
    mmio = [z for z in top if not z.key.startswith(RAPL + ":")]
    kept = msr + [z for z in mmio if z.name not in {x.name for x in msr}]
    if any(z.name != PLATFORM for z in kept):
        kept = [z for z in kept if z.name != PLATFORM]
    keys = {z.key for z in kept}
    return kept + [z for z in outside if z.key.rsplit(":", 1)[0] in keys]


class Rapl:
    """The RAPL zones under a powercap root (a recorded tree in tests); read_text is how a file is read."""

    source = RAPL
    wraps = True

    def __init__(self, root: Path = POWERCAP, read_text: ReadText = _read_text):
        self.root, self.read_text = root, read_text
        self.zones = counted_zones(root, read_text)

    def present(self) -> bool:
        return bool(self.zones)

    def read(self) -> Reading:
        reading = Reading(self.source, time.monotonic(), zones={z.key: z for z in self.zones})
        if not self.zones:
            reading.reason = f"not measured: no RAPL zone under {self.root}"
            return reading
        for zone in self.zones:
            path = zone.path / "energy_uj"
            try:
                reading.counters_uj[zone.key] = int(self.read_text(path).strip())
            except PermissionError:
                reading.reason = f"not measured: permission denied reading {path} (root-only on recent kernels)"
                return reading
            except (OSError, ValueError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not a number"
                reading.reason = f"not measured: cannot read {path} ({why})"
                return reading
        return reading


# ---------------------------------------------------------------- NVIDIA


RunCommand = Callable[[list[str]], str]


def _run_smi(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=NVIDIA_TIMEOUT_S).stdout


class NvidiaSmi:
    """Every GPU's energy counter, through nvidia-smi (run: how the command is run, a recorded answer in tests)."""

    source = GPU
    wraps = False  # a 64-bit count of mJ since the driver loaded

    def __init__(self, binary: str | None = None, run: RunCommand = _run_smi):
        self.binary = binary if binary is not None else shutil.which(NVIDIA_SMI)
        self.run = run

    def present(self) -> bool:
        return bool(self.binary)

    def read(self) -> Reading:
        reading = Reading(self.source, time.monotonic())
        if not self.binary:
            reading.reason = f"not measured: no {NVIDIA_SMI} on PATH"
            return reading
        try:
            out = self.run([self.binary, *NVIDIA_QUERY])
        except (OSError, subprocess.SubprocessError) as exc:
            reading.reason = f"not measured: {self.binary} failed ({str(exc).splitlines()[0] if str(exc) else exc!r})"
            return reading
        for line in out.splitlines():
            index, _, value = (part.strip() for part in line.partition(","))
            if not line.strip():
                continue
            try:
                mj = float(value)
            except ValueError:
                # "[N/A]" / "[Not Supported]": a GPU without the counter (before Volta)
                reading.reason = (
                    f"not measured: {NVIDIA_SMI} reports total_energy_consumption {value!r} for GPU {index}"
                )
                return reading
            key = f"gpu{index}"
            reading.zones[key] = Zone(key, key)
            reading.counters_uj[key] = round(mj * 1000)
        if not reading.counters_uj:
            reading.reason = f"not measured: {NVIDIA_SMI} listed no GPU"
        return reading


# ---------------------------------------------------------------- a phase's energy


def meters(root: Path = POWERCAP, read_text: ReadText = _read_text, smi: NvidiaSmi | None = None) -> list[Meter]:
    """The sources present on this machine (possibly none)."""
    found: list[Meter] = []
    rapl = Rapl(root, read_text)
    if rapl.present():
        found.append(rapl)
    gpu = smi if smi is not None else NvidiaSmi()
    if gpu.present():
        found.append(gpu)
    return found


def absent(root: Path = POWERCAP) -> str:
    """Why nothing was read on a machine with no source."""
    where = f"no RAPL zone under {root}" if root.is_dir() else f"no {root} (no RAPL exposed to this machine)"
    return f"not measured: {where} and no {NVIDIA_SMI} on PATH"


def take(sources: list[Meter]) -> list[Reading]:
    return [m.read() for m in sources]


def counted_uj(before: int, after: int, wrap_uj: int | None) -> int | None:
    """The microjoules between two reads of one counter; one wrap past wrap_uj undone, None if it went back without
    one (a counter reset)."""
    if after >= before:
        return after - before
    if wrap_uj:
        return after + wrap_uj - before
    return None


def between(begin: list[Reading], end: list[Reading], no_source: str | None = None) -> dict:
    """The energy between two takes, as a phase record carries it (PhaseRecord.energy)."""
    return over([[b, e] for b, e in zip(begin, end, strict=True)], no_source)


def over(series: list[list[Reading]], no_source: str | None = None) -> dict:
    """The energy of a window from each source's reads in order (its edges, and any between), as PhaseRecord.energy."""
    window = max((s[-1].mono - s[0].mono for s in series if s), default=0.0)
    sources = [_source(reads) for reads in series if reads]
    measured = [s["joules"] for s in sources if s["joules"] is not None]
    out: dict = {"joules": sum(measured) if measured else None, "window_s": window, "sources": sources}
    if not measured:
        reasons = [s["reason"] for s in sources] or [no_source or absent()]
        out["reason"] = "; ".join(dict.fromkeys(reasons))
    return out


def _source(reads: list[Reading]) -> dict:
    """One source's joules by zone over consecutive reads, or the first reason it could not be counted."""
    entry: dict = {"source": reads[0].source}
    total: dict[str, int] = {}
    reason = next((r.reason for r in reads if r.reason), None)
    for b, e in itertools.pairwise(reads):
        if reason is not None:
            break
        reason = _wrapped_twice(b, e)
        for key, zone in e.zones.items():
            if reason is not None:
                break
            uj = counted_uj(b.counters_uj[key], e.counters_uj[key], zone.wrap_uj) if key in b.counters_uj else None
            if uj is None:
                reason = f"not measured: {key} ({zone.name}) went back without wrapping (a counter reset)"
            else:
                total[key] = total.get(key, 0) + uj
    if reason is not None:
        return {**entry, "joules": None, "reason": reason}
    zones = reads[-1].zones
    entry["zones"] = [{"zone": k, "name": zones[k].name, "joules": uj / 1e6} for k, uj in total.items()]
    entry["joules"] = sum(uj for uj in total.values()) / 1e6
    return entry


def _wrapped_twice(b: Reading, e: Reading) -> str | None:
    """A zone that could pass its whole range between two reads at its highest power: one wrap undone is not
    enough to know what it counted."""
    gap = e.mono - b.mono
    for zone in e.zones.values():
        if zone.wrap_uj and zone.max_power_uw and gap * zone.max_power_uw >= zone.wrap_uj:
            return (
                f"not measured: {gap:.0f} s between two reads of {zone.key} ({zone.name}), which can pass its whole "
                f"range in {zone.wrap_uj / zone.max_power_uw:.0f} s at its highest power"
            )
    return None


class Watch:
    """One phase's window: `begin()` before its first request, `measure()` after its last (as hostnoise.Watch).

    In between, a counter that wraps (RAPL's) is read every tick_s on a thread of its own, so that a long phase
    undoes each wrap: a read is a few sysfs files, microseconds, unlike the host noise's process sweep."""

    def __init__(self, sources: list[Meter] | None = None, no_source: str | None = None, tick_s: float = TICK_S):
        self.sources = meters() if sources is None else sources
        self.no_source, self.tick_s = no_source, tick_s
        self.series: list[list[Reading]] | None = None
        self._stop: threading.Event | None = None
        self._ticker: threading.Thread | None = None

    def begin(self) -> None:
        self.stop()
        self._start(take(self.sources))

    def _start(self, first: list[Reading]) -> None:
        self.series = [[r] for r in first]
        wrapping = [i for i, m in enumerate(self.sources) if getattr(m, "wraps", False)]
        if wrapping and self.tick_s > 0:
            self._stop = threading.Event()
            self._ticker = threading.Thread(
                target=self._tick, args=(self._stop, self.series, wrapping), name="energy-ticker", daemon=True
            )
            self._ticker.start()

    def _tick(self, stop: threading.Event, series: list[list[Reading]], wrapping: list[int]) -> None:
        while not stop.wait(self.tick_s):
            for i in wrapping:
                series[i].append(self.sources[i].read())

    def stop(self) -> None:
        """End the window without measuring it (a phase that was interrupted, an engine elsewhere, the run's end)."""
        self.series = None
        self._halt()

    def _halt(self) -> None:
        if self._stop is not None and self._ticker is not None:
            self._stop.set()
            self._ticker.join()
        self._stop = self._ticker = None

    def measure(self, go_on: bool = False) -> dict | None:
        """The energy since begin() (or the last measure that went on); go_on: the next window starts at this read
        (a burst of several rounds writes a record per round, each its own window)."""
        if self.series is None:
            return None
        self._halt()
        last = take(self.sources)
        for reads, read in zip(self.series, last, strict=True):
            reads.append(read)
        series, self.series = self.series, None
        if go_on:
            self._start(last)
        return over(series, self.no_source)


def describe(energy: dict | None) -> str:
    """One line for the progress output and the report."""
    if not isinstance(energy, dict):
        return "energy not recorded"
    joules = energy.get("joules")
    if not isinstance(joules, (int, float)):
        return "energy " + str(energy.get("reason") or "not measured")
    names = ", ".join(
        f"{s.get('source')} {s['joules']:.1f} J"
        for s in energy.get("sources") or []
        if isinstance(s.get("joules"), (int, float))
    )
    return f"energy {joules:.1f} J ({names})"
