"""A running console: the collector, the app and uvicorn in a thread, started and stopped as one.

    with Console(bootstrap, http_port=0, data_dir=...) as console:
        print(console.url)

`http_port=0` picks a free port (`url` says which). The server listens on 127.0.0.1 only. `stop`
(or leaving the `with`) ends the live feeds, stops uvicorn, then the collector, which resumes
what the console paused and heals what it isolated.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from chaos.console.collector import REFRESH_MS_DEFAULT, Collector

SERVER_START_TIMEOUT_S = 15.0
SERVER_STOP_TIMEOUT_S = 10.0
# A connection's request headers must be complete this long after it opened (or after its last
# response), and at most this many connections are open (chaos/console/http_guard.py): past
# either, it is closed. A page holds one for its live feed and a few for its requests.
HEADERS_TIMEOUT_S = 10.0
CONNECTIONS_MAX = 256


class ConsoleStartFailed(RuntimeError):
    pass


def _listening_socket(port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", port))
    except OSError as error:
        listener.close()
        raise ConsoleStartFailed(f"cannot listen on 127.0.0.1:{port}: {error.strerror}") from None
    listener.listen(64)
    listener.setblocking(False)
    return listener


class Console:
    def __init__(
        self,
        bootstrap: str,
        *,
        http_port: int = 0,
        data_dir: str = "",
        cluster: Any = None,
        refresh_ms: int = REFRESH_MS_DEFAULT,
    ) -> None:
        self.collector = Collector(bootstrap, data_dir=data_dir, cluster=cluster, refresh_ms=refresh_ms)
        self.http_port = http_port
        self.cluster = cluster
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.labs: Any = None

    def start(self) -> "Console":
        import uvicorn

        from chaos.console.app import ConsoleApp
        from chaos.console.explain import Explainer

        self._socket = _listening_socket(self.http_port)
        port = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        try:
            self.collector.start()
            if self.cluster is not None:
                from chaos.console.labs import LabRunner

                self.labs = LabRunner(self.cluster, self.collector)
            self.app = ConsoleApp(
                self.collector,
                explainer=Explainer(self.collector),
                labs=self.labs,
                metrics=_metrics_or_none(self.collector),
            )
            from chaos.console.http_guard import GuardedH11Protocol

            protocol = type("ConsoleHttpProtocol", (GuardedH11Protocol,),
                            {"headers_timeout_s": HEADERS_TIMEOUT_S, "connections_max": CONNECTIONS_MAX})
            config = uvicorn.Config(
                self.app.app,
                http=protocol,
                log_level="warning",
                lifespan="off",
                access_log=False,
                timeout_graceful_shutdown=1,
                ws="none",
            )
            self._server = uvicorn.Server(config)
            self._thread = threading.Thread(
                target=self._server.run, kwargs={"sockets": [self._socket]}, name="console-http", daemon=True
            )
            self._thread.start()
            self._wait_started()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_started(self) -> None:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive():
                raise ConsoleStartFailed("the HTTP server stopped while starting")
            if time.monotonic() > deadline:
                raise ConsoleStartFailed(
                    f"the HTTP server did not start within {SERVER_START_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.02)

    def stop(self) -> list[str]:
        """Stop everything; returns sentences about faults that could not be undone."""
        if getattr(self, "app", None) is not None:
            self.app.broadcaster.close()
        if self.labs is not None:
            self.labs.stop()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(SERVER_STOP_TIMEOUT_S)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(SERVER_STOP_TIMEOUT_S)
            self._thread = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        return self.collector.stop()

    def __enter__(self) -> "Console":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _metrics_or_none(collector: Collector) -> Any:
    try:
        from chaos.console.metrics import ClusterMetrics
    except ImportError:  # prometheus_client is an optional extra
        return None
    return ClusterMetrics(collector)
