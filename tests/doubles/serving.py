"""Not a stand-in itself: the life of the doubles' in-process HTTP servers (start in a daemon thread, stop, `with`)."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from typing import Self


class ServedInThread:
    """`self.httpd` served from a daemon thread: `.start()` / `.stop()`, or `with Double(...) as double:`."""

    httpd: ThreadingHTTPServer

    def start(self) -> Self:
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
