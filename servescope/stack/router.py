"""A router in front of N replicas: nginx's upstream module (Debian's nginx), round robin or least connections."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path
from urllib.error import HTTPError, URLError
from urllib.request import urlopen

from servescope.contracts.routing import LEAST_CONN, ROUND_ROBIN
from servescope.contracts.runfolder import write_file
from servescope.host import children
from servescope.prometheus.prometheus_config import checked_address
from servescope.stack import provision
from servescope.stack.errors import StackError

POLICIES = {ROUND_ROBIN: "", LEAST_CONN: "least_conn;"}  # the plan's routing policies -> nginx's directive


# A path nginx.conf names goes in double quotes; one with a quote, a backslash or a control character is refused
# (SERVESCOPE_STATE with a newline and a server block once wrote directives of its own into the config).
_UNQUOTABLE = re.compile(r'["\\\x00-\x1f\x7f]')
NGINX_TEST_TIMEOUT_S = 30.0


def _quoted(path: Path) -> str:
    text = str(path)
    if _UNQUOTABLE.search(text):
        raise StackError(
            f"router: the folder {text!r} holds a quote, a backslash or a control character: not in nginx.conf"
        )
    return f'"{text}"'


def config(upstreams: list[str], port: int, policy: str, workdir: Path, host: str = "127.0.0.1") -> str:
    """nginx.conf for one streaming upstream group: no buffering (tokens pass as they come), kept-alive upstream
    connections (a new TCP connection per request would be the router's cost, not the engines'). Every value in it
    checked first: the replicas' and its own host:port, the folder's paths (quoted)."""
    if policy not in POLICIES:
        raise StackError(f"router policy {policy!r}: expected {' or '.join(POLICIES)}")
    if not upstreams:
        raise StackError("a router needs at least one replica")
    try:
        addresses = [
            ":".join(map(str, checked_address(u.removeprefix("http://").rstrip("/"), "replica"))) for u in upstreams
        ]
        listen = ":".join(map(str, checked_address(f"{host}:{port}", "router")))
    except ValueError as exc:
        raise StackError(f"router: {exc}") from None
    servers = "\n".join(f"        server {address} max_fails=0;" for address in addresses)

    def at(name: str) -> str:
        return _quoted(Path(workdir) / name)

    return f"""worker_processes 1;
pid {at("nginx.pid")};
error_log {at("error.log")} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {at("body")};
    proxy_temp_path {at("proxy")};
    fastcgi_temp_path {at("fastcgi")};
    uwsgi_temp_path {at("uwsgi")};
    scgi_temp_path {at("scgi")};
    upstream replicas {{
        {POLICIES[policy]}
{servers}
        keepalive 256;
    }}
    server {{
        listen {listen};
        location / {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
            proxy_next_upstream off;
        }}
    }}
}}
"""


def nginx_test(binary: str, workdir: Path, conf: Path) -> str | None:
    """`nginx -t` on the config before it is used: its refusal in one line, or None."""
    try:
        proc = subprocess.run(
            [binary, "-t", "-q", "-p", str(workdir), "-c", str(conf), "-e", "stderr", "-g", "daemon off;"],
            capture_output=True,
            text=True,
            timeout=NGINX_TEST_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"nginx -t did not finish within {NGINX_TEST_TIMEOUT_S:g} s"
    if proc.returncode == 0:
        return None
    said = proc.stderr + proc.stdout
    emerg = re.search(r"\[emerg\] \d+#\d+: (.*)", said)  # after nginx's own time stamp and pid
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    return emerg.group(1).strip() if emerg else (lines[-1] if lines else f"exit {proc.returncode}")


class Router:
    """nginx in the foreground of its own folder, started and stopped with the caller (`with Router(...) as url`)."""

    def __init__(self, upstreams: list[str], port: int, policy: str, workdir: Path):
        self.workdir = Path(workdir)
        self.port = port
        self.text = config(upstreams, port, policy, self.workdir)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> str:
        binary = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
        if binary is None:
            raise StackError(f"nginx is not installed: {provision.NGINX.how_to_install}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        for temp in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.workdir / temp).mkdir(exist_ok=True)
            (self.workdir / temp).chmod(0o777)  # nginx's workers drop to nobody when started as root
        conf = write_file(self.workdir / "nginx.conf", self.text)
        refused = nginx_test(binary, self.workdir, conf)
        if refused is not None:
            raise StackError(f"nginx -t refuses the generated {conf}: {refused}")
        self.proc = subprocess.Popen(
            [binary, "-p", str(self.workdir), "-c", str(conf), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=open(self.workdir / "stderr.log", "w"),  # noqa: SIM115 - the child holds it for its life
        )
        url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                said = (self.workdir / "stderr.log").read_text().strip().splitlines()
                raise StackError(f"nginx exited ({self.proc.returncode}): {said[-1] if said else 'no output'}")
            try:
                urlopen(url + "/health", timeout=1).close()
                return url
            except HTTPError:  # nginx answered (a replica's status passed on)
                return url
            except (URLError, OSError):
                time.sleep(0.1)
        self.__exit__(None, None, None)
        raise StackError(f"nginx did not answer on {url} within 10 s")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            children.stop(self.proc)
