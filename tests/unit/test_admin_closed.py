"""An `Admin` used after `close()` refuses at once (railmq/admin.py).

Before, `close()` only dropped its sockets: the next call opened new ones and carried on (or
waited out its timeout where no cluster answered), so a closed client kept connections and
ports a caller believed released, like a `Producer` or `Consumer` used after close would not.
"""

from __future__ import annotations

import time

import pytest

from actors.errors import ErrorCode, RailmqError
from actors.messages import PartitionMetadata, TopicMetadata
from railmq.admin import Admin, AdminClosed
from railmq.group_admin import GroupAdminClient

NOBODY = "tcp://127.0.0.1:1"


@pytest.mark.parametrize("call", [lambda admin: admin.list_topics(),
                                  lambda admin: admin.delete_topic("orders"),
                                  lambda admin: admin.runtime_stats("tcp://127.0.0.1:2")])
def test_a_closed_admin_refuses_every_request_without_opening_a_socket(call):
    admin = Admin(NOBODY, timeout_ms=2_000)
    admin.close()
    started = time.monotonic()

    with pytest.raises(AdminClosed) as refused:
        call(admin)

    assert refused.value.code == ErrorCode.INVALID_REQUEST and "closed" in str(refused.value)
    assert isinstance(refused.value, RailmqError)
    assert time.monotonic() - started < 0.5, "refused at once, not after the request timeout"
    assert not admin.rpc._sockets, "no connection opened"


def test_close_twice_and_the_context_manager_after_close_are_harmless():
    with Admin(NOBODY, timeout_ms=100) as admin:
        admin.close()
    admin.close()
    with pytest.raises(AdminClosed):
        admin.list_topics()


@pytest.mark.parametrize("call", [lambda client: client.list_offset("orders", 0, -1),
                                  lambda client: client.list_offsets([("orders", 0)], -1),
                                  lambda client: client.timestamp_at("orders", 0, 5)])
def test_a_closed_group_admin_client_refuses_even_a_request_to_a_leader_it_knows(call):
    """The group tools ask leaders through their Admin's RPC client: with the topic's leader
    known from before the close, a request went out on a new socket."""
    client = GroupAdminClient(NOBODY, timeout_ms=2_000)
    client._topics["orders"] = TopicMetadata(name="orders", partitions=[
        PartitionMetadata(partition=0, leader=1, leader_endpoint="tcp://127.0.0.1:2")])
    client.close()

    with pytest.raises(AdminClosed):
        call(client)
    assert not client.admin.rpc._sockets
