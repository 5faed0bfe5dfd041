"""bench/screenshots.py: the README's report images come from recorded run folders, and a host without Chromium is
told so in one line."""

from __future__ import annotations

import struct

from bench import screenshots


def test_each_image_has_its_recorded_run_and_is_a_small_first_screen():
    for name, run_id in screenshots.REPORTS.items():
        folder = screenshots.RUNS / run_id
        assert (folder / "manifest.json").is_file() and (folder / "requests.jsonl").is_file(), folder
        image = screenshots.IMAGES / f"report-{name}.png"
        head = image.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", head[16:24]) == (screenshots.WIDTH, screenshots.FIRST_SCREEN)
        assert image.stat().st_size < 150_000  # README images stay small (an adaptive palette)
    assert {"knee.json"} <= {p.name for p in (screenshots.RUNS / screenshots.REPORTS["knee"]).iterdir()}


def test_no_chromium_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(screenshots.shutil, "which", lambda name: None)
    assert screenshots.run(["--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "screenshots: no chromium on PATH (apt-get install -y chromium)\n"
    assert not list(tmp_path.iterdir())
