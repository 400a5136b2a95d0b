"""`railmq up` checks the ports it will listen on before it starts anything (railmq/cli_cluster.py)."""

from __future__ import annotations

import argparse
import socket

from railmq import cli_cluster
from railmq.cli_common import EXIT_FAILED


def test_up_with_the_console_refuses_an_http_port_in_use_before_the_cluster_starts(
        monkeypatch, tmp_path, capsys):
    """`up --console --http-port P` with P held by another process started every node, then
    stopped them all with INVALID_CONFIG once the console could not listen. The console's port
    is checked with the cluster's now, and nothing starts."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]

    class NoCluster:
        def __init__(self, **options):
            raise AssertionError("a cluster was started")

    monkeypatch.setattr(cli_cluster, "LocalCluster", NoCluster)
    args = argparse.Namespace(nodes=3, controllers=None, port=0, data_dir=str(tmp_path), detach=False,
                              rebuild_metadata=False, reset_group_state=False, console=True, http_port=port)
    try:
        assert cli_cluster.taken_port(args) == port
        assert cli_cluster.run_up(args) == EXIT_FAILED
    finally:
        held.close()
    error = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is in use" in error and "--http-port" in error, error
    assert cli_cluster.taken_port(argparse.Namespace(nodes=3, controllers=None, port=0, console=False,
                                                     http_port=port)) is None
