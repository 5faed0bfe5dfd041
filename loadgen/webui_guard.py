"""The web UI's START, guarded: a request from another site is refused, every field is checked by the option table the
CLI uses, prompt files are read only from where the operator said, and a refused form leaves nothing behind.

Locust's `/swarm` handler takes any field that names a parsed option (`results`, `metrics_port`, Locust's own
`html_file`), converts values as it can, and keeps them for the next START; its page sends no token, and it answers
any origin. So a page open in the user's browser could POST the form to 127.0.0.1:8089 with `prompts` a local file
and `host` its own server, and read that file. Here, in front of every request (a Flask before_request hook):

- the Host header must name this machine (an IP address, `localhost`, its host name): a DNS name rebound to
  127.0.0.1 by another site is refused;
- a browser's `Sec-Fetch-Site` must say the request is the page's own (or typed by the user), and a request that
  changes something (POST: START, STOP, reset) must carry an `Origin` (else a `Referer`) of the web UI itself. This is
  an origin check, not Locust's `--web-login`: the page's own requests carry the header, a script must send it
  (`Origin: http://127.0.0.1:8089`), and another site's page cannot forge it;
- START's form may hold only Locust's own fields (user count, spawn rate, host, run time, profile) and the table's
  web-UI options, each checked as its flag is (loadgen/options.py: the type, the choices), the host as an engine URL,
  the prompts as a set that loads, from the shipped sets, LOADGEN_PROMPT_DIR (--prompt-dir) or the set the UI started
  with; anything else is one line in the UI and on stderr, and nothing starts;
- what Locust then keeps is the form that was accepted: a START that fails later (in test_start) puts the options
  back as they were before it.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
from pathlib import Path

from loadgen import options as option_table
from loadgen.targets import TargetError, default_url, parse_engine
from servescope import workloads
from servescope.contracts.settings import KnobTable
from servescope.workloads import prompts as prompt_sets

# Locust's own START fields (its form), and what each may be.
LOCUST_FIELDS = {
    "user_count": option_table.users,
    "spawn_rate": option_table.positive_number,
    "host": str,
    "run_time": str,
    "profile": str,
}
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OWN_FETCH_SITES = frozenset({"same-origin", "none"})  # Sec-Fetch-Site: the page itself, or typed / bookmarked
SWITCH_VALUES = {"true": True, "false": False, "on": True, "off": False, "": False}


def install(environment, web_ui) -> None:
    """Put the guard in front of the web UI's every request."""
    from flask import jsonify, request

    started_with = environment.parsed_options.prompts

    def guard():
        problem = origin_problem(request)
        if problem is not None:
            _say(f"web UI: refused {request.method} {request.path}: {problem}")
            return jsonify({"success": False, "message": problem, "host": environment.host}), 403
        if request.method == "POST" and request.path.rstrip("/").endswith("/swarm"):
            # A START is a run's entry: the knobs as they are now.
            problem = form_problem(environment, request.form, started_with, KnobTable.from_env())
            if problem is not None:
                _say(f"web UI START refused: {problem}")
                return jsonify({"success": False, "message": problem, "host": environment.host})
            # What a START that fails in test_start puts back: the options before this form was applied.
            environment.servescope_before_start = (dict(vars(environment.parsed_options)), environment.host)
        return None

    web_ui.app.before_request(guard)


def forget_start(environment) -> None:
    """A START that failed after the form was taken: its values are not kept for the next one."""
    before = getattr(environment, "servescope_before_start", None)
    if before is None:
        return
    values, host = before
    vars(environment.parsed_options).clear()
    vars(environment.parsed_options).update(values)
    environment.host = host
    environment.servescope_before_start = None


def _say(line: str) -> None:
    print(f"loadgen: {' '.join(line.split())}", file=sys.stderr, flush=True)


def _this_machine(host: str) -> bool:
    """Whether a Host header's name is this machine's: an IP address (no site can rebind one), localhost, the host
    name. A DNS name of another site rebound to 127.0.0.1 is none of them."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]").lower()
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    own = {"localhost", socket.gethostname().lower(), socket.getfqdn().lower()}
    return name in own or name.endswith(".localhost")


def origin_problem(request) -> str | None:
    """Why a request is not the web UI's own (None: it is)."""
    host = request.host or ""
    if not _this_machine(host):
        return f"Host {host!r} is not this machine's name (a page of another site, its name pointed here?)"
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in OWN_FETCH_SITES:
        return f"a request from another site (Sec-Fetch-Site: {site})"
    if request.method in SAFE_METHODS:
        return None
    own = f"{request.scheme}://{host}"
    origin = request.headers.get("Origin")
    if origin is not None:
        return None if origin == own else f"a request from another origin ({origin}, not {own})"
    referer = request.headers.get("Referer")
    if referer is not None:
        return None if referer == own or referer.startswith(own + "/") else "a request from another page (Referer)"
    return f"no Origin or Referer header: the web UI's page sends one; a script must send Origin: {own}"


def _options_for_the_form() -> dict[str, option_table.Option]:
    return {o.dest: o for o in option_table.for_locust() if o.web_ui}


def form_problem(environment, form, started_with: str | None, knobs: KnobTable) -> str | None:
    """The one line that says what is wrong with a START form (None: it may start), checked before Locust keeps
    any of it: the same option table as the CLI, then the run it asks for as the CLI's prepare() would see it
    (`knobs`: where an engine without a URL would be)."""
    table = _options_for_the_form()
    candidate = argparse.Namespace(**vars(environment.parsed_options))
    host = environment.host
    for key in form:
        values = form.getlist(key)
        if len(values) != 1:
            return f"{key}: given {len(values)} times"
        value = values[0]
        if key in LOCUST_FIELDS:
            try:
                converted = LOCUST_FIELDS[key](value)
            except (argparse.ArgumentTypeError, ValueError) as exc:
                return f"{key}: {exc}"
            if key == "host":
                host = converted
            elif key == "run_time" and converted.strip():
                return "run_time: the scenario sets how long it runs (duration, requests): leave Run time empty"
            continue
        option = table.get(key)
        if option is None:
            return f"{key}: not a field of this form (the web UI takes {', '.join(sorted(table))})"
        try:
            setattr(candidate, key, _value(option, value, getattr(candidate, key, None)))
        except (argparse.ArgumentTypeError, ValueError) as exc:
            return f"{option.flag}: {exc}"
    engine = candidate.engine
    if not str(host or "").strip():
        return f"Host: empty: give the engine's URL (e.g. {default_url(engine, knobs)})"
    try:
        parse_engine(f"{engine}={host}")
    except TargetError as exc:
        return str(exc).replace("--engine", "Host", 1)
    problem = _prompt_files_problem(candidate.prompts, candidate.prompt_dir, started_with)
    if problem is not None:
        return problem
    try:
        option_table.validate(candidate)
        prompt_set = prompt_sets.load(candidate.prompts)
        workloads.check(candidate.scenario, prompt_set)
    except ValueError as exc:
        return " ".join(str(exc).split())
    return None


def _value(option: option_table.Option, text: str, current):
    """A form value as the option takes it (its type, its choices); a switch is true or false. Empty means "none"
    only for an option that has none now (Locust would convert "" to the current value's type and fail)."""
    if option.switch:
        if text.strip().lower() not in SWITCH_VALUES:
            raise ValueError(f"expected true or false, got {text!r}")
        return SWITCH_VALUES[text.strip().lower()]
    if option.choices is not None and text not in option.choices:
        raise ValueError(f"expected one of {', '.join(option.choices)}, got {text!r}")
    if not text.strip():
        if current not in (None, "") and not isinstance(current, str):
            raise ValueError("empty: give a value")
        return text
    if option.type is not None:
        option.type(text)  # refuses what the flag would
    return text


def _prompt_files_problem(spec: str, prompt_dir: str | None, started_with: str | None) -> str | None:
    """A spec read from the web UI may read only the shipped sets, files under LOADGEN_PROMPT_DIR, or the set the web
    UI was started with: a form must not send a local file's content to the host it names."""
    try:
        wanted = prompt_sets.source_files(spec)
        allowed_as_started = {p.resolve() for p in prompt_sets.source_files(started_with)} if started_with else set()
    except prompt_sets.PromptSetError as exc:
        return str(exc)
    folders = [prompt_sets.DATA_DIR.resolve()]
    if prompt_dir:
        folders.append(Path(prompt_dir).expanduser().resolve())
    for path in wanted:
        real = path.resolve()
        if real in allowed_as_started or any(real.is_relative_to(folder) for folder in folders):
            continue
        where = (
            f"the shipped sets or {folders[1]}" if prompt_dir else "the shipped sets (LOADGEN_PROMPT_DIR is not set)"
        )
        return f"prompts: {path}: the web UI reads prompt files only from {where}"
    return None
