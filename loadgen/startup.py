"""Work Locust and gevent do at start and at stop that a load run never uses, skipped without changing what they do.

- gevent's monkey-patching asks importlib.metadata for its plugins once per module it patches: 25 scans of every
  installed distribution's metadata while Locust imports. The installed distributions do not change meanwhile, so
  one scan answers all of them (`entry_points_scanned_once`).
- Locust's Runner.stop() names its caller in a debug line through inspect.stack(), which reads the source of every
  frame and, the first time, walks the thousand modules loaded to find their files. With Locust's debug logging
  off nobody reads that line, and Locust's own fallback (the line without the caller) is taken instead
  (`stop_without_naming_the_caller`).
- Locust's HttpSession keeps one TLS context, made with the system's root certificates at import (to spare each
  https request loading them). No `python -m loadgen` user has an HttpSession (the requests go through
  loadgen/client.py), so the certificates, 0.03 CPU s, are loaded the first time the context is asked anything
  (`certificates_loaded_on_use`).
- Locust's runners import its master-worker messaging (ZeroMQ through locust.rpc.zmqrpc, msgpack through its
  message format) whatever they run; only a master or a worker (`--workers`) sends a message. Those two modules are
  loaded when first used, not when imported: the real modules, their bodies run then (`rpc_loaded_on_use`).
- Locust imports its web UI (Flask, Werkzeug and their extensions) whatever it runs. `python -m loadgen` never makes one:
  `make webui` execs Locust's own main, which imports it as usual. So here `locust.web` is a stand-in whose WebUI
  refuses to be made (`without_the_web_ui`).

Together they were about a fifth of a 4-request run's CPU; bench/loadgen_accuracy.py's short run measures it whole.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import sys
import types
from collections.abc import Iterator


@contextlib.contextmanager
def entry_points_scanned_once() -> Iterator[None]:
    """importlib.metadata.entry_points answered from one scan while the block runs (Locust's import)."""
    real = importlib.metadata.entry_points
    scanned: list[importlib.metadata.EntryPoints] = []

    def once(**selection):
        if not scanned:
            scanned.append(real())
        return scanned[0].select(**selection) if selection else scanned[0]

    importlib.metadata.entry_points = once
    try:
        yield
    finally:
        importlib.metadata.entry_points = real


class _CallerUnnamed:
    """The `inspect` locust.runners sees: stack() as the real one while Locust logs at DEBUG, else refused at once
    (Runner.stop() catches it and says "couldn't determine where stop() was called from", at DEBUG)."""

    def __init__(self, real, logger: logging.Logger):
        self._real, self._logger = real, logger

    def stack(self, *args, **kwargs):
        if self._logger.isEnabledFor(logging.DEBUG):
            return self._real.stack(*args, **kwargs)[1:]  # from its caller's frame on, as if called directly
        raise LookupError("the caller is not looked up: Locust's debug logging is off")

    def __getattr__(self, name: str):
        return getattr(self._real, name)


def stop_without_naming_the_caller() -> None:
    """Locust's runners given the `inspect` above (once; a second call changes nothing)."""
    import inspect

    import locust.runners

    if not isinstance(locust.runners.inspect, _CallerUnnamed):
        locust.runners.inspect = _CallerUnnamed(inspect, locust.runners.logger)


class _ContextOnUse:
    """A TLS context made, and the certificate locations asked of it loaded, the first time anything else is asked of
    it: then it is that context (every attribute and method is the real one's)."""

    def __init__(self, make):
        self._make, self._locations, self._context = make, [], None

    def load_verify_locations(self, *args, **kwargs):
        if self._context is None:
            self._locations.append((args, kwargs))
            return None
        return self._context.load_verify_locations(*args, **kwargs)

    def _real(self):
        if self._context is None:
            context = self._make()
            for args, kwargs in self._locations:
                context.load_verify_locations(*args, **kwargs)
            self._context = context
        return self._context

    def __getattr__(self, name: str):
        return getattr(self._real(), name)

    def __setattr__(self, name: str, value) -> None:
        if name in ("_make", "_locations", "_context"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._real(), name, value)  # urllib3 sets verify_mode, check_hostname, ... on its context


class _BeforeLocustClients:
    """An import hook that finds nothing: asked for locust.clients (after Locust's gevent patching, before the module
    runs), it makes urllib3's TLS contexts load their certificates on use, and steps aside."""

    def __init__(self):
        self.real = None

    def find_spec(self, name, path=None, target=None):
        if name == "locust.clients" and self.real is None:
            import urllib3.util

            self.real = real = urllib3.util.create_urllib3_context
            urllib3.util.create_urllib3_context = lambda *a, **k: _ContextOnUse(lambda: real(*a, **k))
        return None


@contextlib.contextmanager
def certificates_loaded_on_use() -> Iterator[None]:
    """TLS contexts locust.clients makes at import, while the block runs (Locust's import), load their certificates
    when first used, not when made. urllib3 is imported only once gevent has patched ssl (as Locust orders it)."""
    hook = _BeforeLocustClients()
    sys.meta_path.insert(0, hook)
    try:
        yield
    finally:
        sys.meta_path.remove(hook)
        if hook.real is not None:
            import urllib3.util

            urllib3.util.create_urllib3_context = hook.real


RPC_MODULES = frozenset({"locust.rpc.zmqrpc", "msgpack"})  # Locust's messaging, and the encoding of its messages


class _LoadedOnUse:
    """An import hook: asked for one of `names` (not yet imported), it finds it as the path finder does and gives it a
    lazy loader (importlib.util.LazyLoader): the module is made at once, its body runs at its first attribute read."""

    def __init__(self, names: frozenset[str]):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


@contextlib.contextmanager
def rpc_loaded_on_use() -> Iterator[None]:
    """Locust's messaging modules (RPC_MODULES), imported while the block runs (Locust's import), loaded when a master
    or a worker first uses them (0.01-0.03 CPU s of a 4-request run that never does). Only a first import can be
    lazy (a second `import` statement loads the module, in this Python): each is imported once, by locust.rpc, and
    read from there after."""
    hook = _LoadedOnUse(RPC_MODULES)
    sys.meta_path.insert(0, hook)
    try:
        yield
    finally:
        sys.meta_path.remove(hook)


class _NoWebUI:
    """locust.web.WebUI in a `python -m loadgen` process: never made there."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("python -m loadgen runs Locust headless; its web UI is `make webui` (Locust's own main)")


def without_the_web_ui() -> None:
    """`locust.web` stood in for, before Locust is imported (after, it is the real one and stays)."""
    if "locust" in sys.modules:
        return
    stand_in = types.ModuleType("locust.web", "Locust's web UI, not loaded: loadgen/startup.py")
    stand_in.WebUI = _NoWebUI
    sys.modules["locust.web"] = stand_in
