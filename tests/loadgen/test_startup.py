"""Start-up and stop work skipped in Locust and gevent (loadgen/startup.py): the same answers, fewer scans."""

from __future__ import annotations

import importlib.metadata

from loadgen import startup
from tests.harness import in_a_fresh_interpreter


def test_entry_points_scanned_once_give_what_every_scan_gives_and_the_real_function_back(monkeypatch):
    real = importlib.metadata.entry_points
    expected = sorted(ep.name for ep in real(group="console_scripts"))
    scans = []
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: scans.append(kw) or real(**kw))
    counting = importlib.metadata.entry_points
    with startup.entry_points_scanned_once():
        first = sorted(ep.name for ep in importlib.metadata.entry_points(group="console_scripts"))
        again = sorted(ep.name for ep in importlib.metadata.entry_points(group="console_scripts"))
        none = list(importlib.metadata.entry_points(group="servescope.no-such-group"))
        everything = importlib.metadata.entry_points()
    assert first == again == expected and none == []
    assert "console_scripts" in everything.groups
    assert scans == [{}]  # four questions, one scan of everything
    assert importlib.metadata.entry_points is counting


def test_gevent_patches_the_same_under_one_scan():
    # In a fresh interpreter: Locust imported inside the block patches the socket module as it always does.
    probe = (
        "from loadgen import startup\n"
        "with startup.entry_points_scanned_once():\n"
        "    import locust\n"
        "import socket, gevent.socket, gevent.monkey, importlib.metadata\n"
        "print(socket.socket is gevent.socket.socket, gevent.monkey.is_module_patched('threading'),\n"
        "      importlib.metadata.entry_points.__module__)\n"
    )
    assert in_a_fresh_interpreter(probe).split() == ["True", "True", "importlib.metadata"]


def test_a_stop_names_its_caller_only_when_locust_logs_at_debug():
    # In a fresh interpreter: Locust must be imported first there (gevent's patching), never inside pytest's.
    probe = (
        "import locust, inspect, logging, locust.runners\n"
        "from loadgen import startup\n"
        "startup.stop_without_naming_the_caller()\n"
        "startup.stop_without_naming_the_caller()\n"
        "shim = locust.runners.inspect\n"
        "print(isinstance(shim, startup._CallerUnnamed), shim._real is inspect, shim.getframeinfo is inspect.getframeinfo)\n"
        "try:\n"
        "    shim.stack()\n"
        "except LookupError:\n"
        "    print('refused')\n"
        "locust.runners.logger.setLevel(logging.DEBUG)\n"
        "print(shim.stack()[0].function)\n"
    )
    assert in_a_fresh_interpreter(probe).split() == ["True", "True", "True", "refused", "<module>"]


def test_a_headless_process_imports_no_web_framework_and_refuses_a_web_ui():
    probe = (
        "import sys\n"
        "from loadgen import startup\n"
        "startup.without_the_web_ui()\n"
        "import loadgen.cli, locust.env\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'flask', 'werkzeug', 'flask_cors', 'flask_login'}))\n"
        "try:\n"
        "    locust.env.Environment().create_web_ui()\n"
        "except RuntimeError as exc:\n"
        "    print(str(exc).split(';')[0])\n"
    )
    assert in_a_fresh_interpreter(probe).splitlines() == ["[]", "python -m loadgen runs Locust headless"]


def test_the_web_ui_stand_in_is_not_put_in_after_locust_is_imported():
    probe = (
        "import locust, locust.web, sys\n"
        "from loadgen import startup\n"
        "startup.without_the_web_ui()\n"
        "print(sys.modules['locust.web'].__file__.endswith('web.py'))\n"
    )
    assert in_a_fresh_interpreter(probe).split() == ["True"]


def test_locusts_tls_context_loads_its_certificates_when_first_used_and_is_then_the_same():
    # In a fresh interpreter: Locust imported inside the block (after gevent's patching, as `python -m loadgen` does).
    probe = (
        "import sys\n"
        "from loadgen import startup\n"
        "with startup.entry_points_scanned_once(), startup.certificates_loaded_on_use():\n"
        "    import locust.clients\n"
        "import ssl, urllib3.util\n"
        "from requests.utils import DEFAULT_CA_BUNDLE_PATH, extract_zipped_paths\n"
        "made = locust.clients._preloaded_ssl_context\n"
        "print(made._context is None, urllib3.util.create_urllib3_context.__module__)\n"
        "usual = urllib3.util.create_urllib3_context()\n"
        "usual.load_verify_locations(extract_zipped_paths(DEFAULT_CA_BUNDLE_PATH))\n"
        "print(made.cert_store_stats() == usual.cert_store_stats(), made.cert_store_stats()['x509_ca'] > 0)\n"
        "made.check_hostname = False\n"
        "made.verify_mode = ssl.CERT_NONE\n"
        "print(made._context.verify_mode == ssl.CERT_NONE, isinstance(made._context, ssl.SSLContext))\n"
        "print(made.wrap_socket.__self__ is made._context, 'locust.clients' in sys.modules)\n"
    )
    assert in_a_fresh_interpreter(probe).split() == ["True", "urllib3.util.ssl_"] + ["True"] * 6


def test_the_certificates_hook_leaves_nothing_behind_where_locust_is_already_imported():
    probe = (
        "import locust, sys, urllib3.util\n"
        "from loadgen import startup\n"
        "real, hooks = urllib3.util.create_urllib3_context, list(sys.meta_path)\n"
        "with startup.certificates_loaded_on_use():\n"
        "    import locust.clients\n"
        "print(urllib3.util.create_urllib3_context is real, sys.meta_path == hooks,\n"
        "      type(locust.clients._preloaded_ssl_context).__name__)\n"
    )
    assert in_a_fresh_interpreter(probe).split() == ["True", "True", "SSLContext"]


def test_locusts_messaging_module_is_imported_lazily_and_loads_whole_when_a_master_uses_it():
    # In a fresh interpreter: Locust imported inside the block, as `python -m loadgen` does.
    probe = (
        "import sys\n"
        "from loadgen import startup\n"
        "hooks = list(sys.meta_path)\n"
        "with startup.entry_points_scanned_once(), startup.rpc_loaded_on_use():\n"
        "    import locust.env, locust.runners\n"
        "lazy = sorted(n for n in startup.RPC_MODULES if type(sys.modules[n]).__name__ == '_LazyModule')\n"
        "print(sys.meta_path == hooks, 'zmq' in sys.modules, lazy == sorted(startup.RPC_MODULES))\n"
        "server = locust.runners.rpc.Server('127.0.0.1', 0)\n"
        "message = locust.rpc.Message('ping', {'n': 1}, 'me')\n"
        "print('zmq' in sys.modules, server.port > 0, locust.rpc.Message.unserialize(message.serialize()).data)\n"
        "print(locust.runners.rpc is sys.modules['locust.rpc.zmqrpc'], type(sys.modules['msgpack']).__name__)\n"
        "server.close(linger=0)\n"
    )
    assert in_a_fresh_interpreter(probe).splitlines() == ["True False True", "True True {'n': 1}", "True module"]
