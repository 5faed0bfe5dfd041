"""The README's report images: the first screen of a comparison (what `make up` runs), a quick and a knee report, as
headless Chromium shows them, made again from the run folders recorded under tests/fixtures/runs.

`python -m bench.screenshots` (`make screenshots`) writes docs/images/report-{compare,quick,knee}.png; `--full DIR`
also writes each whole page there in slices, to read a report through before committing its image. Not a benchmark:
`make bench` leaves it out (no main()).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "tests" / "fixtures" / "runs"
IMAGES = ROOT / "docs" / "images"
# Image name -> the recorded run folder it shows.
REPORTS = {"compare": "compare-vllm-llamacpp", "quick": "quick-llamacpp", "knee": "knee-vllm"}
RECORDS = ("manifest.json", "phases.jsonl", "requests.jsonl", "samples.jsonl", "knee.json", "quick.txt")
WIDTH, FIRST_SCREEN = 1280, 900  # a laptop's browser window: what a reader sees before scrolling
PAGE_HEIGHT = 30_000  # taller than any of these pages: the full page in one shot, blank below cropped off
SLICE = 1500  # the full page's slices, each readable at once
COLOURS = 64  # an adaptive palette: the page is text, tables and a few plot colours (a third of the bytes)
NO_PROMETHEUS = "http://127.0.0.1:9"  # the gauges come from the run's own samples; no Prometheus is asked


def browser() -> str | None:
    return next(
        (found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))), None
    )


def report(folder: Path, cwd: Path) -> Path:
    """The report of one run folder (its path relative to cwd, as the report's subtitle shows it)."""
    proc = subprocess.run(
        [sys.executable, "-m", "servescope.report", "--run", str(folder), "--prometheus", NO_PROMETHEUS],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"report on {folder}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    return cwd / folder / "report.html"


def shoot(chrome: str, page: Path, out: Path, height: int) -> None:
    subprocess.run(
        [
            chrome,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={out}",
            f"--window-size={WIDTH},{height}",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=300,
        check=True,
    )


def small(path: Path) -> None:
    """The same pixels in an adaptive palette of COLOURS colours (text stays sharp, the file a third)."""
    from PIL import Image

    with Image.open(path) as im:
        im.convert("RGB").quantize(COLOURS, dither=Image.Dither.NONE).save(path, optimize=True)


def slices(whole: Path, out: Path, name: str) -> list[Path]:
    """The page without the blank below it, in SLICE-high pieces."""
    from PIL import Image, ImageChops

    with Image.open(whole) as im:
        rgb = im.convert("RGB")
        box = ImageChops.difference(rgb, Image.new("RGB", rgb.size, (255, 255, 255))).getbbox()
        bottom = min(rgb.height, (box[3] if box else rgb.height) + 20)
        written = []
        for k, top in enumerate(range(0, bottom, SLICE)):
            path = out / f"{name}-{k:02d}.png"
            rgb.crop((0, top, WIDTH, min(bottom, top + SLICE))).save(path)
            written.append(path)
    return written


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.screenshots", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=IMAGES, help=f"where the first screens go (default {IMAGES})")
    p.add_argument("--full", type=Path, metavar="DIR", help="also write each whole page here, in slices")
    args = p.parse_args(argv)
    chrome = browser()
    if chrome is None:
        print("screenshots: no chromium on PATH (apt-get install -y chromium)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.full:
        args.full.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="servescope-screens-") as tmp:
        work = Path(tmp)
        for name, run_id in REPORTS.items():
            folder = Path("results") / run_id
            (work / folder).mkdir(parents=True)
            for record in RECORDS:
                if (RUNS / run_id / record).is_file():
                    shutil.copy2(RUNS / run_id / record, work / folder / record)
            try:
                page = report(folder, work)
                image = args.out / f"report-{name}.png"
                shoot(chrome, page, image, FIRST_SCREEN)
                small(image)
                print(f"screenshots: {image.relative_to(ROOT) if image.is_relative_to(ROOT) else image}")
                if args.full:
                    whole = work / f"{name}-page.png"
                    shoot(chrome, page, whole, PAGE_HEIGHT)
                    for piece in slices(whole, args.full, f"report-{name}"):
                        print(f"screenshots: {piece}")
            except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
                print(f"screenshots: {name}: {exc}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(run())
