"""Locust's own outputs in the run folder (loadgen/locust_outputs.py): its report page compiled once, the same page."""

from __future__ import annotations

import json
import os

from tests.harness import run_python

# In a fresh interpreter: Locust must be imported first there (gevent's patching), never inside pytest's process.
# The page written twice (compiled, then from the cache) beside the one Locust renders itself from the same stats.
PROBE = """
import json, sys
from pathlib import Path
import locust.html
from locust import User
from locust.env import Environment
from loadgen.locust_outputs import write_locust_outputs
from servescope.contracts.urls import redact

class Quiet(User):
    pass

env = Environment(user_classes=[Quiet], host="http://user:secret@127.0.0.1:9")
env.create_local_runner()
env.events.request.fire(request_type="chat", name="vllm burst", response_time=12.5, response_length=64,
                        exception=None, context={})
out = Path(sys.argv[1])
pages = []
for run in ("first", "second"):
    (out / run).mkdir()
    write_locust_outputs(env, out / run)
    pages.append((out / run / "locust.html").read_text())
env.host = redact(env.host)  # as the run folder's page has it
own = locust.html.get_html_report(env, show_download_link=False)
print(json.dumps({
    "same": pages[0] == pages[1] == own,
    "secret": any("secret" in page for page in pages),
    "restored": locust.html.render_template_from.__module__,
    "size": len(pages[0]),
}))
"""


def written(tmp_path, cache: str) -> dict:
    out = tmp_path / "out"
    out.mkdir()
    proc = run_python("-c", PROBE, out, env={"SERVESCOPE_CACHE": cache, "SAMPLE_INTERVAL_MS": "0"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_report_page_compiled_once_is_the_page_locust_renders(tmp_path):
    cache = tmp_path / "cache"
    said = written(tmp_path, str(cache))
    assert said["same"] and not said["secret"] and said["size"] > 1000
    assert said["restored"] == "locust.html"  # Locust's own renderer back after the page is written
    compiled = list((cache / "jinja2").iterdir())
    assert len(compiled) == 1 and compiled[0].stat().st_size > 1000  # the page, compiled once for both runs
    assert (cache / "jinja2").stat().st_mode & 0o777 == 0o700


def test_without_a_cache_folder_the_page_is_compiled_as_locust_does(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    said = written(tmp_path, str(blocked))
    assert said["same"] and not said["secret"]


def test_a_cache_folder_open_to_others_or_unwritable_costs_the_cache_never_the_page(tmp_path):
    # Its files are compiled code the run loads: a folder others may write is not used; one this user cannot write
    # (made by sudo, a read-only home) is not either, and the page is compiled as Locust does.
    shared = tmp_path / "shared"
    (shared / "jinja2").mkdir(parents=True)
    (shared / "jinja2").chmod(0o777)
    said = written(tmp_path, str(shared))
    assert said["same"] and list((shared / "jinja2").iterdir()) == []
    if os.getuid() != 0:  # root writes through any mode: the case needs another user
        locked = tmp_path / "locked"
        (locked / "jinja2").mkdir(parents=True)
        (locked / "jinja2").chmod(0o500)
        (tmp_path / "out").rename(tmp_path / "out-before")
        assert written(tmp_path, str(locked))["same"]


# A template of our own through the same cache: its code is used while the file's path, size and modification time
# are the same (the source is not read: changed bytes under the same stamp still render the stored code), and compiled
# again from the new source when the file changes.
CACHE_PROBE = """
import json, os, sys
from pathlib import Path
from loadgen.locust_outputs import compiled, template_cache

page = Path(sys.argv[1]) / "page.html"
page.write_text("Hello {{ name }}!")
stamp = page.stat().st_mtime_ns
said = [compiled(template_cache(), page).render(name="first")]
page.write_text("Bye!! {{ name }}!")  # the same size
os.utime(page, ns=(stamp, stamp))
said.append(compiled(template_cache(), page).render(name="second"))
os.utime(page, ns=(stamp + 10**9, stamp + 10**9))
said.append(compiled(template_cache(), page).render(name="third"))
print(json.dumps(said))
"""


def test_the_compiled_page_is_kept_for_the_same_file_and_compiled_again_when_it_changes(tmp_path):
    proc = run_python("-c", CACHE_PROBE, tmp_path, env={"SERVESCOPE_CACHE": str(tmp_path / "cache")}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["Hello first!", "Hello second!", "Bye!! third!"]
    assert len(list((tmp_path / "cache" / "jinja2").iterdir())) == 2  # one per stamp of the file
