"""How soon the supervisor starts an exited actor again (transport/supervisor.py): at once after
a crash or a kill, later and later while it keeps stopping on a full disk or refusing to start."""

from __future__ import annotations

import signal

import pytest

from transport.actor_main import EXIT_CRASHED, EXIT_DISK_FULL, ActorSpec
from transport.supervisor import (
    CRASH_LOOP_WINDOW_MS, REFUSED_RESTART_DELAY_MAX_MS, ActorStartFailed, ManagedActor, Supervisor,
)

MS = 1_000_000


def delays(supervisor: Supervisor, managed: ManagedActor, exit_codes: list[int]) -> list[int]:
    found = []
    for code in exit_codes:
        managed.exit_code = code
        found.append(supervisor._restart_delay_ns(managed) // MS)
    return found


def test_an_actor_that_keeps_stopping_on_a_full_disk_is_retried_later_and_later():
    supervisor = Supervisor(restart_delay_ms=500)
    managed = ManagedActor(ActorSpec(kind="controller", name="controller/1", cluster_id="c", data_dir="/x"))
    assert delays(supervisor, managed, [EXIT_DISK_FULL] * 6) == [1000, 2000, 4000, 8000, 10_000, 10_000]
    assert REFUSED_RESTART_DELAY_MAX_MS == 10_000


def test_a_crash_or_a_kill_is_restarted_at_once_and_starts_the_doubling_over():
    supervisor = Supervisor(restart_delay_ms=200)
    managed = ManagedActor(ActorSpec(kind="replica", name="replica/t/0/n1", cluster_id="c", data_dir="/x"))
    assert delays(supervisor, managed, [-signal.SIGKILL, EXIT_CRASHED, 1]) == [200, 200, 200]
    assert delays(supervisor, managed, [EXIT_DISK_FULL, EXIT_DISK_FULL, -signal.SIGKILL, EXIT_DISK_FULL]) == [
        400, 800, 200, 400]


def test_an_actor_that_keeps_failing_soon_after_it_starts_is_retried_later_and_later():
    """An exception at every start (a directory it cannot use, a file it cannot read) was restarted
    every half second for ever. From the third failure in a row within CRASH_LOOP_WINDOW_MS of its
    start, the delay doubles; one that ran longer, or a kill, starts over."""
    import time

    supervisor = Supervisor(restart_delay_ms=200)
    managed = ManagedActor(ActorSpec(kind="replica", name="replica/t/0/n1", cluster_id="c", data_dir="/x"))

    def quick(codes: list[int]) -> list[int]:
        found = []
        for code in codes:
            managed.started_ns = time.monotonic_ns()  # it failed at once
            found += delays(supervisor, managed, [code])
        return found

    assert quick([1] * 8) == [200, 200, 400, 800, 1600, 3200, 6400, 10_000]
    assert quick([-signal.SIGKILL, 1, 1, 1]) == [200, 200, 200, 400], "a kill starts the count over"
    managed.started_ns = time.monotonic_ns() - (CRASH_LOOP_WINDOW_MS + 1) * MS
    assert delays(supervisor, managed, [1]) == [200], "it ran a while: a crash, not a crash loop"
    assert quick([1, 1]) == [200, 200]


@pytest.mark.timeout(60)
def test_an_actor_that_cannot_listen_refuses_to_start_in_one_sentence(tmp_path, capfd):
    """`railmq node --bind 10.9.9.9` (an address this machine lacks): the actor's bind raised a
    ZMQError whose whole traceback came before the node's one-line refusal. Now it refuses to
    start naming the address, and its supervisor retries later and later as for any refusal."""
    supervisor = Supervisor(restart_delay_ms=100, ready_timeout_s=30)
    spec = ActorSpec(kind="coordinator", name="coordinator", cluster_id="c", data_dir=str(tmp_path),
                     bind_host="192.0.2.1", port=7)  # TEST-NET-1: never an address of this machine
    try:
        managed = supervisor.launch(spec)
        with pytest.raises(ActorStartFailed, match="refused to start: cannot listen on tcp://192.0.2.1:7"):
            supervisor.wait_ready([managed])
    finally:
        supervisor.stop_all()
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.timeout(60)
def test_an_actor_whose_port_another_process_holds_is_started_again_once_the_port_is_free(tmp_path, capfd):
    """A restarted cluster binds its actors' remembered ports, and a port may be held meanwhile by
    another process's connection (an ephemeral port is any free one). Refused for good, the
    cluster's restart failed at once ("cannot listen on ...: Address already in use"), once in a
    CI run. A port in use is not an address the machine lacks: the actor waits for it (up to
    `PORT_IN_USE_WAIT_S`) and listens once it is free."""
    import socket
    import threading

    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    release = threading.Timer(1.0, holder.close)
    supervisor = Supervisor(restart_delay_ms=100, ready_timeout_s=30)
    spec = ActorSpec(kind="coordinator", name="coordinator", cluster_id="c", data_dir=str(tmp_path),
                     port=port)
    try:
        release.start()
        managed = supervisor.launch(spec)
        supervisor.wait_ready([managed])
        assert managed.endpoint == f"tcp://127.0.0.1:{port}"
    finally:
        release.cancel()
        holder.close()
        supervisor.stop_all()
    assert "Traceback" not in capfd.readouterr().err
