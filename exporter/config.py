"""The exporter's configuration: engine URLs from flags/env, or a YAML file listing named instances; checked at start-up.

With no file, each of VLLM_URL, LLAMACPP_URL, OLLAMA_URL (or --vllm-url, --llamacpp-url,
--ollama-url) that is set adds one instance named after its kind. A YAML file (--config FILE)
lists the instances instead; URL flags and env vars are then ignored::

    listen_address: 127.0.0.1     # optional; else --listen-address, SERVESCOPE_BIND, 127.0.0.1
    port: 9464                    # optional; else --port, EXPORTER_PORT, 9464
    timeout_seconds: 3            # optional; per-instance budget of one scrape (keep it below
                                  # Prometheus' scrape_timeout)
    engines:
      - kind: vllm                # vllm | llamacpp | ollama
        name: vllm-a              # the `instance` label; unique; letters, digits, . _ : -
        url: http://127.0.0.1:8009
      - kind: vllm
        name: vllm-b
        url: http://127.0.0.1:8010
        timeout_seconds: 2        # optional per-instance override
      - kind: ollama
        name: ollama
        url: http://127.0.0.1:11434
        proxy_port: 11435         # ollama only: where the streaming proxy listens; null = no proxy
        num_parallel: 1           # ollama only: the OLLAMA_NUM_PARALLEL that Ollama runs with
      - kind: llamacpp
        name: llama
        url: http://127.0.0.1:8081
        api_key: sk-...           # optional: the key of an engine started with --api-key; else
                                  # VLLM_API_KEY / LLAMACPP_API_KEY (never logged or shown)
    processes:                    # optional: native engines whose CPU and memory to export
      - kind: vllm
        name: vllm-a              # the `instance` label (default: the kind)
        pidfile: ~/.local/state/servescope/run/vllm.json   # a plain pid, or the stack's JSON record
    containers:                   # optional: engine containers, read through the Docker engine
      - kind: ollama
        name: ollama
        container: servescope-ollama

On the command line the same is `--process NAME=PIDFILE` and `--container NAME=CONTAINER`
(repeatable; NAME is `kind` or `kind:instance`); given there, they replace the file's lists.

Precedence: command-line flag > config file > environment (.env, .env.example) > built-in default.
Without a file the single Ollama instance's proxy listens on OLLAMA_PROXY_PORT (11435) and
assumes OLLAMA_NUM_PARALLEL (1). Every problem is reported as ONE line naming the key, e.g.
`config error: engines[1].url: missing`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from exporter.resources import WatchedContainer, WatchedProcess
from servescope import engines
from servescope.contracts import metrics_mode
from servescope.contracts.settings import KnobTable
from servescope.contracts.urls import redact
from servescope.engines.base import BATCH_SLOTS

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
TOP_KEYS = {"listen_address", "port", "timeout_seconds", "engines", "processes", "containers"}
PROCESS_KEYS = {"kind", "name", "pidfile"}
CONTAINER_KEYS = {"kind", "name", "container"}
ENGINE_KEYS = {"kind", "name", "url", "timeout_seconds", "proxy_port", "num_parallel", "api_key"}
OLLAMA_ONLY = {"proxy_port", "num_parallel"}
DEFAULT_TIMEOUT = 3.0


class ConfigError(Exception):
    """A bad setting; str() is the one line shown to the user."""

    def __init__(self, key: str, problem: str):
        # A key is user text too: one with a newline or control character is shown quoted.
        shown = key if key.isprintable() and key.strip() == key and key else repr(key)
        # Redacted: a URL the user wrote with user:password@ in it is echoed back without the password.
        super().__init__(redact(f"config error: {shown}: {problem}").replace("\n", "\\n"))
        self.key = key


@dataclass(frozen=True)
class Instance:
    """One engine instance the exporter reads: its kind, name and URL, its timeout and its API key."""

    kind: str
    name: str
    url: str
    timeout: float = DEFAULT_TIMEOUT
    proxy_port: int | None = None  # Ollama only
    num_parallel: int = 1  # Ollama only
    api_key: str = field(default="", repr=False)  # sent as a Bearer token; a secret, so never in a repr


@dataclass(frozen=True)
class Config:
    """The exporter's checked configuration: where it listens, the instances, processes and containers it watches."""

    listen_address: str = "127.0.0.1"
    port: int = 9464
    timeout: float = DEFAULT_TIMEOUT
    instances: tuple[Instance, ...] = field(default_factory=tuple)
    processes: tuple[WatchedProcess, ...] = field(default_factory=tuple)
    containers: tuple[WatchedContainer, ...] = field(default_factory=tuple)
    fleet: bool = False  # METRICS_MODE=fleet: the page's own series are Prometheus' rules', not the exporter's


def load(args, table: KnobTable | None = None) -> Config:
    """Config from parsed CLI args (attributes as in exporter.cli) and, if given, args.config; what neither says, from
    the knobs (`table`; None: as the environment sets them now: this is the exporter's boundary)."""
    table = KnobTable.from_env() if table is None else table
    file_data: dict = {}
    if getattr(args, "config", None):
        file_data = read_file(Path(args.config))

    listen_address = _pick(
        args.listen_address, file_data.get("listen_address"), table.text("SERVESCOPE_BIND", "127.0.0.1")
    )
    if not isinstance(listen_address, str) or not listen_address:
        raise ConfigError("listen_address", f"expected a host or address, got {listen_address!r}")
    port = _port("port", _pick(args.port, file_data.get("port"), table.text("EXPORTER_PORT", "9464")))
    timeout = _seconds(
        "timeout_seconds", _pick(getattr(args, "timeout", None), file_data.get("timeout_seconds"), DEFAULT_TIMEOUT)
    )

    if getattr(args, "config", None) and "engines" in file_data:
        instances = _file_instances(file_data["engines"], timeout, table)
    else:
        instances = _url_instances(args, timeout, table)
    _check_ports(instances, port)
    processes = (
        _flag_watches("--process", args.process, "pidfile")
        if getattr(args, "process", None)
        else _file_watches("processes", file_data.get("processes"), "pidfile")
    )
    containers = (
        _flag_watches("--container", args.container, "container")
        if getattr(args, "container", None)
        else _file_watches("containers", file_data.get("containers"), "container")
    )
    mode = getattr(args, "metrics_mode", None) or table.text(metrics_mode.KNOB, metrics_mode.EXPORTER)
    try:
        fleet = metrics_mode.is_fleet(mode)
    except ValueError:
        raise ConfigError(metrics_mode.KNOB, f"{mode!r}: expected {' or '.join(metrics_mode.MODES)}") from None
    return Config(
        fleet=fleet,
        listen_address=listen_address,
        port=port,
        timeout=timeout,
        instances=instances,
        processes=processes,
        containers=containers,
    )


def read_file(path: Path) -> dict:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(str(path), f"not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), "expected a mapping with an 'engines' list")
    for key in data:
        if key not in TOP_KEYS:
            raise ConfigError(str(key), f"unknown key (expected one of {', '.join(sorted(TOP_KEYS))})")
    return data


def _file_instances(entries: object, timeout: float, table: KnobTable) -> tuple[Instance, ...]:
    if not isinstance(entries, list):
        raise ConfigError("engines", "expected a list of engine instances")
    instances: list[Instance] = []
    names: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"engines[{index}]"
        if not isinstance(entry, dict):
            raise ConfigError(where, "expected a mapping with kind, name and url")
        for key in entry:
            if key not in ENGINE_KEYS:
                raise ConfigError(f"{where}.{key}", f"unknown key (expected one of {', '.join(sorted(ENGINE_KEYS))})")
        kind = _required(entry, "kind", where)
        if kind not in engines.ENGINES:
            raise ConfigError(
                f"{where}.kind", f"unknown engine kind {kind!r} (expected one of {', '.join(engines.ENGINES)})"
            )
        name = _required(entry, "name", where)
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise ConfigError(f"{where}.name", f"{name!r} is not a name (1-64 letters, digits, . _ : -)")
        if name in names:
            raise ConfigError(f"{where}.name", f"{name!r} is used twice")
        names.add(name)
        url = _url(f"{where}.url", _required(entry, "url", where))
        if engines.kind(kind).proxy_port_env is None:
            for key in OLLAMA_ONLY & set(entry):
                raise ConfigError(f"{where}.{key}", f"only meaningful for kind: {', '.join(_proxied())}")
        proxy_port = entry.get("proxy_port")
        instances.append(
            Instance(
                kind=kind,
                name=name,
                url=url,
                timeout=_seconds(f"{where}.timeout_seconds", entry.get("timeout_seconds", timeout)),
                proxy_port=None if proxy_port is None else _port(f"{where}.proxy_port", proxy_port),
                num_parallel=_positive_int(f"{where}.num_parallel", entry.get("num_parallel", 1)),
                api_key=(
                    _api_key(f"{where}.api_key", entry["api_key"]) if "api_key" in entry else _knob_api_key(kind, table)
                ),
            )
        )
    return tuple(instances)


def _watch(key: str, kind: object, name: object, where: str, target: object):
    if kind not in engines.ENGINES:
        raise ConfigError(key, f"unknown engine kind {kind!r} (expected one of {', '.join(engines.ENGINES)})")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ConfigError(key, f"{name!r} is not a name (1-64 letters, digits, . _ : -)")
    if not isinstance(target, str) or not target.strip():
        raise ConfigError(
            key, f"expected a {'pid file path' if where == 'pidfile' else 'container name or id'}, got {target!r}"
        )
    if where == "pidfile":
        return WatchedProcess(kind=kind, name=name, pidfile=Path(target.strip()).expanduser())
    return WatchedContainer(kind=kind, name=name, container=target.strip())


def _flag_watches(flag: str, specs: list[str], where: str) -> tuple:
    """`--process vllm=PIDFILE`, `--process vllm:vllm-b=PIDFILE` (instance vllm-b), same for --container."""
    watches = []
    for spec in specs:
        name, sep, target = spec.partition("=")
        if not sep:
            raise ConfigError(flag, f"expected NAME={where.upper()}, got {spec!r}")
        kind, _, instance = name.strip().partition(":")
        watches.append(_watch(flag, kind, instance or kind, where, target))
    return _unique(flag, watches)


def _file_watches(key: str, entries: object, where: str) -> tuple:
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise ConfigError(key, f"expected a list of mappings with kind, name and {where}")
    allowed = PROCESS_KEYS if where == "pidfile" else CONTAINER_KEYS
    watches = []
    for index, entry in enumerate(entries):
        at = f"{key}[{index}]"
        if not isinstance(entry, dict):
            raise ConfigError(at, f"expected a mapping with kind, name and {where}")
        for item in entry:
            if item not in allowed:
                raise ConfigError(f"{at}.{item}", f"unknown key (expected one of {', '.join(sorted(allowed))})")
        kind = _required(entry, "kind", at)
        target = _required(entry, where, at)
        name = entry.get("name", kind)
        bad_key = (
            f"{at}.kind"
            if kind not in engines.ENGINES
            else f"{at}.name"
            if not (isinstance(name, str) and NAME_PATTERN.match(name))
            else f"{at}.{where}"
        )
        watches.append(_watch(bad_key, kind, name, where, target))
    return _unique(key, watches)


def _unique(key: str, watches: list) -> tuple:
    # The same engine instance twice would expose one series twice: Prometheus rejects the whole scrape.
    seen = set()
    for watch in watches:
        if (watch.kind, watch.name) in seen:
            raise ConfigError(key, f"{watch.kind} {watch.name!r} is watched twice")
        seen.add((watch.kind, watch.name))
    return tuple(watches)


def _url_instances(args, timeout: float, table: KnobTable) -> tuple[Instance, ...]:
    instances = []
    for kind in engines.ENGINES.values():
        flag = f"--{kind.name}-url"
        url = getattr(args, f"{kind.name}_url", None) or table.text(kind.url_env)
        if not url:
            continue
        key = flag if getattr(args, f"{kind.name}_url", None) else kind.url_env
        extra = {}
        if kind.proxy_port_env:
            # The proxy's port and the slots it relays to (Ollama reports neither): the CLI's or the knobs'.
            slots = kind.lever(BATCH_SLOTS).env
            extra["proxy_port"] = _port(
                "--proxy-port" if args.proxy_port is not None else kind.proxy_port_env,
                _pick(args.proxy_port, None, table.text(kind.proxy_port_env, "11435")),
            )
            extra["num_parallel"] = _positive_int(
                "--ollama-num-parallel" if args.ollama_num_parallel is not None else slots,
                _pick(args.ollama_num_parallel, None, table.text(slots, "1")),
            )
        instances.append(
            Instance(
                kind=kind.name,
                name=kind.name,
                url=_url(key, url),
                timeout=timeout,
                api_key=_knob_api_key(kind.name, table),
                **extra,
            )
        )
    return tuple(instances)


def _proxied() -> list[str]:
    """The kinds the exporter proxies (Ollama): proxy_port and num_parallel mean something for them only."""
    return [kind.name for kind in engines.ENGINES.values() if kind.proxy_port_env]


def _check_ports(instances: tuple[Instance, ...], exporter_port: int) -> None:
    used = {exporter_port: "port"}
    for index, instance in enumerate(instances):
        if instance.proxy_port is None:
            continue
        if instance.proxy_port in used:
            raise ConfigError(
                f"engines[{index}].proxy_port", f"{instance.proxy_port} is already taken by {used[instance.proxy_port]}"
            )
        used[instance.proxy_port] = f"engines[{index}].proxy_port"


def _pick(flag, from_file, default):
    for value in (flag, from_file):
        if value is not None:
            return value
    return default


def _required(entry: dict, key: str, where: str):
    value = entry.get(key)
    if value is None or value == "":
        raise ConfigError(f"{where}.{key}", "missing")
    return value


def _url(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError(key, f"expected an http:// URL, got {value!r}")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(key, f"expected an http:// or https:// URL with a host, got {value!r}")
    try:
        parts.port  # noqa: B018 -- raises on a port that is not a number
    except ValueError:
        raise ConfigError(key, f"bad port in {value!r}") from None
    return value.rstrip("/")


def _knob_api_key(kind: str, table: KnobTable) -> str:
    env = engines.ENGINES[kind].api_key_env
    return _api_key(env, table.text(env)) if env else ""


def _api_key(key: str, value: object) -> str:
    # Checked for what would break the request head; the value itself is never echoed.
    if not isinstance(value, str) or not (value.isascii() and value.isprintable()) or value != value.strip():
        raise ConfigError(key, "expected an API key: printable characters, no surrounding blanks")
    return value


def _port(key: str, value: object) -> int:
    number = _positive_int(key, value)
    if number > 65535:
        raise ConfigError(key, f"{number} is not a TCP port (1-65535)")
    return number


def _number(key: str, value: object, kind: type[int] | type[float], expected: str) -> int | float:
    """`value` (YAML's, a flag's or a knob's text) as `kind`; a bool or what does not convert is one line."""
    if isinstance(value, bool):  # YAML's yes/no: int(True) would be 1
        raise ConfigError(key, f"expected {expected}, got {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(key, f"expected {expected}, got {value!r}") from None


def _positive_int(key: str, value: object) -> int:
    number = _number(key, value, int, "a positive integer")
    if number < 1 or (isinstance(value, float) and value != number):
        raise ConfigError(key, f"expected a positive integer, got {value!r}")
    return number


def _seconds(key: str, value: object) -> float:
    number = _number(key, value, float, "seconds")
    if not 0 < number <= 120:
        raise ConfigError(key, f"expected seconds between 0 and 120, got {value!r}")
    return number
