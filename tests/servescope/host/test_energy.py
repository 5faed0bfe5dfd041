"""Energy per phase from recorded powercap trees and nvidia-smi answers: zones counted once, wraps undone, unreadable said."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from loadgen.targets import Target
from loadgen.trials import NoiseKeeper
from servescope.contracts.runfolder import PhaseRecord, RunFolder
from servescope.host import energy

RANGE_UJ = 262143328850  # a package zone's max_energy_range_uj on Intel client and server parts


def zone(devices: Path, parent: Path | None, key: str, name: str, uj: int, max_power_uw: int | None = None) -> Path:
    """One zone directory as the kernel lays it out: a sub-zone lives inside its parent's directory."""
    path = (parent or devices) / key
    path.mkdir(parents=True)
    (path / "name").write_text(name + "\n")
    (path / "energy_uj").write_text(f"{uj}\n")
    (path / "max_energy_range_uj").write_text(f"{RANGE_UJ}\n")
    (path / "enabled").write_text("1\n")
    if max_power_uw is not None:
        (path / "max_power_range_uw").write_text(f"{max_power_uw}\n")
    return path


def powercap(tmp_path: Path, *, psys: bool = False, mmio: bool = False) -> tuple[Path, dict[str, Path]]:
    """/sys/class/powercap as a two-socket server shows it: every zone a symlink at the top, into the device tree."""
    devices = tmp_path / "devices" / "intel-rapl"
    devices.mkdir(parents=True)
    (devices / "enabled").write_text("1\n")
    zones: dict[str, Path] = {}
    for n in (0, 1):
        pkg = zones[f"intel-rapl:{n}"] = zone(devices, None, f"intel-rapl:{n}", f"package-{n}", 1_000_000)
        for m, name in enumerate(("core", "uncore", "dram")):
            zones[f"intel-rapl:{n}:{m}"] = zone(devices, pkg, f"intel-rapl:{n}:{m}", name, 1_000_000)
    if psys:
        zones["intel-rapl:2"] = zone(devices, None, "intel-rapl:2", "psys", 1_000_000)
    if mmio:
        mmio_dir = tmp_path / "devices" / "intel-rapl-mmio"
        zones["intel-rapl-mmio:0"] = zone(mmio_dir, None, "intel-rapl-mmio:0", "package-0", 1_000_000)
    root = tmp_path / "class" / "powercap"
    root.mkdir(parents=True)
    (root / "intel-rapl").symlink_to(devices)
    for key, path in zones.items():
        (root / key).symlink_to(path)
    return root, zones


def set_uj(path: Path, uj: int) -> None:
    (path / "energy_uj").write_text(f"{uj}\n")


def test_sub_zones_inside_the_package_are_not_counted_again_but_dram_is(tmp_path):
    root, zones = powercap(tmp_path)
    rapl = energy.Rapl(root)
    assert sorted((z.key, z.name) for z in rapl.zones) == [
        ("intel-rapl:0", "package-0"),
        ("intel-rapl:0:2", "dram"),
        ("intel-rapl:1", "package-1"),
        ("intel-rapl:1:2", "dram"),
    ]
    begin = rapl.read()
    set_uj(zones["intel-rapl:0"], 31_000_000)  # +30 J
    set_uj(zones["intel-rapl:0:0"], 26_000_000)  # core: +25 J, inside the package's 30
    set_uj(zones["intel-rapl:0:1"], 3_000_000)  # uncore: +2 J, inside it too
    set_uj(zones["intel-rapl:0:2"], 5_000_000)  # dram: +4 J, outside the package
    set_uj(zones["intel-rapl:1"], 11_000_000)  # +10 J
    record = energy.between([begin], [rapl.read()])
    assert record["joules"] == pytest.approx(44.0)
    (source,) = record["sources"]
    assert source["source"] == "intel-rapl"
    assert {z["zone"]: z["joules"] for z in source["zones"]} == pytest.approx(
        {"intel-rapl:0": 30.0, "intel-rapl:0:2": 4.0, "intel-rapl:1": 10.0, "intel-rapl:1:2": 0.0}
    )


def test_a_tree_without_the_flat_links_finds_sub_zones_inside_their_parent(tmp_path):
    _, zones = powercap(tmp_path)
    keys = {z.key for z in energy.Rapl(tmp_path / "devices" / "intel-rapl").zones}
    assert keys == {"intel-rapl:0", "intel-rapl:0:2", "intel-rapl:1", "intel-rapl:1:2"}


def test_psys_and_an_mmio_copy_of_a_package_are_not_added_to_the_packages(tmp_path):
    root, zones = powercap(tmp_path, psys=True, mmio=True)
    keys = {z.key for z in energy.Rapl(root).zones}
    assert "intel-rapl:2" not in keys and "intel-rapl-mmio:0" not in keys
    assert {"intel-rapl:0", "intel-rapl:1"} <= keys


def test_psys_is_read_where_it_is_the_only_zone(tmp_path):
    devices = tmp_path / "d"
    devices.mkdir()
    zone(devices, None, "intel-rapl:0", "psys", 5)
    assert [z.name for z in energy.Rapl(devices).zones] == ["psys"]


def test_a_counter_that_wrapped_counts_up_to_its_range_and_on_from_zero(tmp_path):
    root, zones = powercap(tmp_path)
    for key in ("intel-rapl:0", "intel-rapl:0:2", "intel-rapl:1", "intel-rapl:1:2"):
        set_uj(zones[key], RANGE_UJ - 2_000_000)  # 2 J before the wrap
    rapl = energy.Rapl(root)
    begin = rapl.read()
    set_uj(zones["intel-rapl:0"], 3_000_000)  # wrapped: 2 J up to the range, 3 J after
    record = energy.between([begin], [rapl.read()])
    assert record["joules"] == pytest.approx(5.0)


def test_a_counter_that_went_back_with_no_range_to_wrap_at_is_not_measured(tmp_path):
    root, zones = powercap(tmp_path)
    (zones["intel-rapl:1"] / "max_energy_range_uj").unlink()
    rapl = energy.Rapl(root)
    begin = rapl.read()
    set_uj(zones["intel-rapl:1"], 10)
    record = energy.between([begin], [rapl.read()])
    assert record["joules"] is None
    assert record["reason"] == "not measured: intel-rapl:1 (package-1) went back without wrapping (a counter reset)"


def test_permission_denied_is_the_reason_never_a_number(tmp_path):
    """energy_uj is root-only on kernels since 5.10; tests may run as root, where mode 000 still reads: a hook."""
    root, _ = powercap(tmp_path)

    def read_text(path: Path) -> str:
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return path.read_text()

    rapl = energy.Rapl(root, read_text)
    assert rapl.present()  # the zones are listed: only their counters are closed
    watch = energy.Watch([rapl], tick_s=0)
    watch.begin()
    record = watch.measure()
    assert record["joules"] is None
    assert record["reason"].startswith(f"not measured: permission denied reading {root}/intel-rapl:0/energy_uj")


def test_no_powercap_directory_and_no_gpu_is_not_measured(tmp_path):
    missing = tmp_path / "powercap"
    sources = energy.meters(missing, smi=energy.NvidiaSmi(binary=""))
    assert sources == []
    watch = energy.Watch(sources, no_source=energy.absent(missing))
    watch.begin()
    record = watch.measure()
    assert record["joules"] is None and record["sources"] == []
    assert record["reason"] == f"not measured: no {missing} (no RAPL exposed to this machine) and no nvidia-smi on PATH"


def test_nvidia_smi_millijoules_of_every_gpu_are_summed():
    answers = iter(["0, 1000000\n1, 2000000\n", "0, 1250000\n1, 2500000\n"])
    asked = []

    def run(argv):
        asked.append(argv)
        return next(answers)

    smi = energy.NvidiaSmi(binary="/usr/bin/nvidia-smi", run=run)
    record = energy.between([smi.read()], [smi.read()])
    assert record["joules"] == pytest.approx(750.0)
    assert "--query-gpu=index,total_energy_consumption" in asked[0]
    assert not energy.NvidiaSmi(binary="").present()


def test_a_gpu_without_the_counter_is_not_measured_with_what_it_said():
    smi = energy.NvidiaSmi(binary="nvidia-smi", run=lambda argv: "0, [N/A]\n")
    record = energy.between([smi.read()], [smi.read()])
    assert record["joules"] is None
    assert record["reason"] == "not measured: nvidia-smi reports total_energy_consumption '[N/A]' for GPU 0"


def test_an_unread_source_beside_a_read_one_is_left_out_and_said(tmp_path):
    root, zones = powercap(tmp_path)
    rapl = energy.Rapl(root)
    gpu = energy.NvidiaSmi(binary="nvidia-smi", run=lambda argv: "0, [N/A]\n")
    begin = energy.take([rapl, gpu])
    set_uj(zones["intel-rapl:0"], 2_000_000)
    record = energy.between(begin, energy.take([rapl, gpu]))
    assert record["joules"] == pytest.approx(1.0) and "reason" not in record
    assert [s["joules"] for s in record["sources"]] == [pytest.approx(1.0), None]


class Wrapping:
    """A RAPL-like counter that gains 600 uJ per read and wraps at 1000: only reads between the edges can follow it."""

    source, wraps = "intel-rapl", True

    def __init__(self):
        self.reads = 0
        self.zone = energy.Zone("intel-rapl:0", "package-0", wrap_uj=1000)

    def read(self) -> energy.Reading:
        value = (600 * self.reads) % 1000
        self.reads += 1
        return energy.Reading(self.source, time.monotonic(), {self.zone.key: value}, {self.zone.key: self.zone})


def test_the_watch_reads_a_wrapping_counter_between_the_edges_and_undoes_every_wrap():
    meter = Wrapping()
    watch = energy.Watch([meter], tick_s=0.001)
    watch.begin()
    deadline = time.monotonic() + 10
    while meter.reads < 6 and time.monotonic() < deadline:
        time.sleep(0.005)
    record = watch.measure()
    reads = meter.reads
    assert reads >= 6  # the ticker read it between the edges
    # Each step gains 600 uJ and passes the range at most once: the edges alone would see at most 1000.
    assert record["joules"] == pytest.approx(600 * (reads - 1) / 1e6)
    assert meter.reads == reads  # the ticker stopped with the window


def test_each_record_of_a_phase_gets_its_own_window():
    """A burst of several rounds writes one record per round: the second round's joules are not the first's again."""

    class Steps:
        source, wraps = "intel-rapl", False
        values = iter([0, 3_000_000, 10_000_000])
        zone = energy.Zone("intel-rapl:0", "package-0", wrap_uj=RANGE_UJ)

        def read(self) -> energy.Reading:
            return energy.Reading(
                self.source, time.monotonic(), {self.zone.key: next(self.values)}, {self.zone.key: self.zone}
            )

    watch = energy.Watch([Steps()])
    watch.begin()
    assert watch.measure(go_on=True)["joules"] == pytest.approx(3.0)
    assert watch.measure()["joules"] == pytest.approx(7.0)
    assert watch.measure() is None  # the window ended without going on


def test_reads_too_far_apart_for_one_wrap_to_be_known_are_not_measured():
    zone_ = energy.Zone("intel-rapl:0", "package-0", wrap_uj=1_000_000, max_power_uw=100_000)  # 10 s to wrap
    begin = energy.Reading("intel-rapl", 0.0, {zone_.key: 5}, {zone_.key: zone_})
    end = energy.Reading("intel-rapl", 12.0, {zone_.key: 9}, {zone_.key: zone_})
    record = energy.between([begin], [end])
    assert record["joules"] is None
    assert "12 s between two reads of intel-rapl:0 (package-0)" in record["reason"]
    assert energy.between([begin], [energy.Reading("intel-rapl", 9.0, {zone_.key: 9}, {zone_.key: zone_})])[
        "joules"
    ] == pytest.approx(4e-6)


def phase_record(phase: str = "burst-1") -> PhaseRecord:
    return PhaseRecord("vllm", "vllm", "burst", phase, 100.0, 110.0, 4, 4, "s", "x", 16)


def target(url: str) -> Target:
    return Target("vllm", "vllm", url, "openai", "/v1/chat/completions")


def test_the_phase_record_carries_the_energy_and_the_run_folder_keeps_it(tmp_path):
    root, zones = powercap(tmp_path)
    keeper = NoiseKeeper([], meters=[energy.Rapl(root)])
    keeper.begin(target("http://127.0.0.1:8000/v1"))
    set_uj(zones["intel-rapl:0"], 8_000_000)
    record = phase_record()
    keeper.annotate(record)
    assert record.energy["joules"] == pytest.approx(7.0)
    assert record.noise is not None  # beside the host noise, in the same record

    folder = RunFolder.create(tmp_path / "results", "r")
    folder.append_phase(record)
    folder.append_phase(phase_record("sequential"))  # a record from before the field: null
    read = {p.phase: p for p in folder.phases()}
    assert read["burst-1"].energy["joules"] == pytest.approx(7.0)
    assert read["burst-1"].energy["sources"][0]["zones"][0]["name"] == "package-0"
    assert read["sequential"].energy is None


def test_an_engine_on_another_host_gets_the_reason_not_this_machines_joules(tmp_path):
    root, zones = powercap(tmp_path)
    keeper = NoiseKeeper([], meters=[energy.Rapl(root)])
    keeper.begin(target("http://10.0.0.7:8000/v1"))
    set_uj(zones["intel-rapl:0"], 8_000_000)
    record = phase_record()
    keeper.annotate(record)
    assert record.energy == {
        "joules": None,
        "reason": "not measured: http://10.0.0.7:8000/v1 is not on this host (its counters are not read here)",
    }


def test_describe_says_the_joules_or_the_reason():
    assert energy.describe(None) == "energy not recorded"
    assert energy.describe({"joules": None, "reason": "not measured: x"}) == "energy not measured: x"
    line = energy.describe({"joules": 12.5, "sources": [{"source": "intel-rapl", "joules": 12.5}]})
    assert line == "energy 12.5 J (intel-rapl 12.5 J)"
