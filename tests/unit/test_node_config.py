"""`railmq node`'s configuration (railmq/node.py): a voter list that cannot form a cluster is
refused with a sentence before anything starts."""

from __future__ import annotations

import os

import pytest

from railmq import cli
from actors.limits import Limits
from railmq.node import ClusterNode, NodeConfigError, load_limits, parse_voters


def test_a_voter_list_names_each_node_and_its_address():
    assert parse_voters("1=10.0.0.1, 2=host-2,3=10.0.0.3") == {1: "10.0.0.1", 2: "host-2", 3: "10.0.0.3"}


@pytest.mark.parametrize("text, problem", [
    ("", "names no node"), ("1=a,1=b", "named twice"), ("0=a", "NODE=HOST"), ("x=a", "NODE=HOST"),
    ("1=", "NODE=HOST"), ("10.0.0.1", "NODE=HOST"),
])
def test_a_malformed_voter_list_is_refused(text, problem):
    with pytest.raises(NodeConfigError, match=problem):
        parse_voters(text)


def test_a_node_that_is_not_a_voter_is_refused(tmp_path):
    with pytest.raises(NodeConfigError, match="not one of the voters"):
        ClusterNode(4, voters={1: "a", 2: "b", 3: "c"}, data_dir=str(tmp_path))


def test_the_endpoints_follow_the_voters_and_the_port(tmp_path):
    node = ClusterNode(2, voters={1: "10.0.0.1", 2: "10.0.0.2", 3: "10.0.0.3"}, data_dir=str(tmp_path), port=9000)
    assert node.bootstrap == "tcp://10.0.0.1:9000,tcp://10.0.0.2:9000,tcp://10.0.0.3:9000"
    assert node.group_voter_endpoints[3] == "tcp://10.0.0.3:9001"
    assert (node.bind_host, node.advertise_host) == ("10.0.0.2", "10.0.0.2")


def test_the_command_refuses_a_bad_voter_list_with_a_typed_error(capsys, tmp_path):
    code = cli.main(["node", "--node", "1", "--voters", "1=a,1=b", "--data-dir", str(tmp_path)])
    assert code != 0 and "INVALID_CONFIG" in capsys.readouterr().err


def test_a_limits_file_changes_only_what_it_names(tmp_path):
    path = tmp_path / "limits.json"
    path.write_text('{"replica_session_timeout_ms": 2500, "node_heartbeat_interval_ms": 250}')
    limits = load_limits(str(path))
    assert (limits.replica_session_timeout_ms, limits.node_heartbeat_interval_ms) == (2500, 250)
    assert limits.controller_election_timeout_ms == Limits().controller_election_timeout_ms


@pytest.mark.parametrize("text, problem", [
    ('{"replica_session_timeout": 2500}', "no limit called replica_session_timeout"),
    ('{"replica_session_timeout_ms": "soon"}', "Expected `int`"),
    ("[1, 2]", "JSON object"),
    ("{", "not JSON"),
    # Values of the right type that cannot work. Before they were checked, an interval of 0 was
    # taken ("railmq node 1 is up") and its timers fired at once, over and over; a fetch bound of
    # 100 GB let answers pass the frame every client decodes; a negative election timeout was
    # found only by the controller's process, which exited with a traceback.
    ('{"replica_heartbeat_interval_ms": 0}', "replica_heartbeat_interval_ms must be positive"),
    ('{"controller_election_timeout_ms": -5}', "controller_election_timeout_ms must be positive"),
    ('{"controller_election_timeout_ms": 100}', "more than two controller heartbeat intervals"),
    ('{"fetch_bytes_max": 100000000000}', "fetch_bytes_max .* frame_bytes_max"),
    ('{"replica_session_timeout_ms": 150}', "replica_heartbeat_interval_ms .* replica_session_timeout_ms"),
    ('{"group_session_timeout_min_ms": 400000}', "group_session_timeout_min_ms .* group_session_timeout_max_ms"),
    # Topic names this long made replica directories past the 255 bytes a file name may have.
    ('{"topic_name_length_max": 249}', "topic_name_length_max .* 255"),
    ('{"partitions_per_topic_max": 100000000000000000000}', "topic_name_length_max .* 255"),
    # What the share groups keep aside must fit in the share records the coordinator may hold.
    ('{"share_records_in_flight_reserved_per_group": 101}', "share_groups_max .* must fit in"),
    ('{"share_records_in_flight_reserved_per_group": 20000}',
     "share_records_in_flight_reserved_per_group .* at most share_records_in_flight_per_group_max"),
])
def test_a_bad_limits_file_is_refused_naming_the_problem(tmp_path, text, problem):
    path = tmp_path / "limits.json"
    path.write_text(text)
    with pytest.raises(NodeConfigError, match=problem):
        load_limits(str(path))


@pytest.mark.parametrize("name", ["node_heartbeat_interval_ms", "replica_session_timeout_ms",
                                  "controller_election_timeout_ms", "scrub_pass_interval_ms"])
def test_a_limits_file_with_a_wait_past_what_a_poll_takes_is_refused(tmp_path, name):
    """`{"node_heartbeat_interval_ms": 2**60, "node_session_timeout_ms": 2**62}` (every ordering
    rule kept) was taken: the node said it was up, its agent's thread died at its first wait
    (`OverflowError: value too large to convert to int` from zmq_poll), and `topics create`
    waited out its timeout."""
    from actors.limits import DURATION_MS_MAX

    path = tmp_path / "limits.json"
    path.write_text(f'{{"{name}": {2**62}}}')
    with pytest.raises(NodeConfigError, match=f"{name} .*at most {DURATION_MS_MAX:,}"):
        load_limits(str(path))
    assert Limits(scrub_pass_interval_ms=DURATION_MS_MAX).scrub_pass_interval_ms == DURATION_MS_MAX


def test_every_problem_of_a_limits_object_is_named_at_once_and_a_grace_of_zero_is_allowed():
    with pytest.raises(ValueError) as refused:
        Limits(node_heartbeat_interval_ms=0, share_describe_bytes_max=1 << 40)
    assert "node_heartbeat_interval_ms must be positive" in str(refused.value)
    assert "share_describe_bytes_max" in str(refused.value)
    assert Limits(coordinator_election_grace_ms=0, partition_creation_grace_ms=0).partition_creation_grace_ms == 0


def test_the_command_refuses_a_missing_limits_file_before_it_starts(capsys, tmp_path):
    code = cli.main(["node", "--node", "1", "--voters", "1=127.0.0.1", "--data-dir", str(tmp_path / "d"),
                     "--limits", str(tmp_path / "nowhere.json")])
    error = capsys.readouterr().err
    assert code != 0 and "INVALID_CONFIG" in error and "nowhere.json" in error
    assert not (tmp_path / "d").exists(), "nothing was started or made"


def test_joining_a_controller_that_does_not_answer_fails_with_a_typed_error_and_makes_nothing(capsys, tmp_path):
    import socket

    with socket.socket() as unused:  # a port nobody listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    code = cli.main(["node", "--node", "3", "--join", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "d")])
    error = capsys.readouterr().err
    assert code != 0 and "REQUEST_TIMED_OUT" in error and f"127.0.0.1:{port}" in error
    assert not (tmp_path / "d").exists()


def test_a_limits_file_far_larger_than_any_limits_object_is_refused_without_reading_it_whole(tmp_path):
    """`--limits` was read whole: `--limits /dev/zero` grew the process until memory ran out
    (under a 1.5 GB address-space limit: a MemoryError traceback after 1.2 s)."""
    path = tmp_path / "limits.json"
    path.write_text(" " * (2 << 20) + '{"replica_session_timeout_ms": 2500}')  # valid JSON, 2 MB of it
    with pytest.raises(NodeConfigError, match="larger than"):
        load_limits(str(path))


def test_a_limits_file_that_never_ends_is_refused():
    with pytest.raises(NodeConfigError, match="larger than"):
        load_limits("/dev/zero")


@pytest.mark.timeout(60)
def test_a_data_dir_of_another_cluster_is_refused_when_the_identity_to_use_is_given(tmp_path):
    """`railmq node --identity-from DIR` on a data directory that already held another cluster's
    identity ignored DIR: node 2 said it was up "cluster otherclust01" beside node 1's cluster
    1fd55eeeb352, with a secret no other voter shares, and the quorum never formed (`cluster
    info`: CLUSTER_UNREACHABLE)."""
    import socket
    import threading

    from storage.directory import ClusterIdentity, adopt_identity, check_identity

    with socket.socket() as unused:  # were the node to start, its voters would listen here
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]

    formed = ClusterIdentity.load_or_create(str(tmp_path / "identity"))
    other = ClusterIdentity.load_or_create(str(tmp_path / "data"))
    node = ClusterNode(2, voters={1: "127.0.0.1", 2: "127.0.0.2"}, data_dir=str(tmp_path / "data"),
                       identity_from=str(tmp_path / "identity"), port=port, trace=False)
    stopped = threading.Event()
    stopped.set()  # a node that does start waits for no voter
    try:
        with pytest.raises(NodeConfigError, match=f"{other.cluster_id}.*{formed.cluster_id}"):
            node.start(stopped)
    finally:
        node.stop()
    kept = ClusterIdentity.load_or_create(str(tmp_path / "data"))
    assert kept.cluster_id == other.cluster_id, "left as it was"
    adopt_identity(str(tmp_path / "identity"), str(tmp_path / "copy"))
    check_identity(str(tmp_path / "identity"), str(tmp_path / "copy"))  # a restart with its own: no refusal


@pytest.mark.parametrize("flags", [["--voters", "1=127.0.0.1", "--advertise", os.fsdecode(b"a\xff")],
                                   ["--voters", "1=127.0.0.1", "--bind", os.fsdecode(b"a\xff")],
                                   ["--voters", os.fsdecode(b"1=a\xff")]],
                         ids=["advertise", "bind", "voters"])
def test_a_host_that_is_not_utf8_is_refused_in_one_line_before_anything_starts(flags, capsys, tmp_path):
    """`railmq node --advertise $'a\\xff'` (or --bind, or a --voters host) ended in a
    `UnicodeEncodeError: ... surrogates not allowed` traceback where the host went into a message."""
    try:
        code = cli.main(["node", "--node", "1", *flags, "--data-dir", str(tmp_path / "d"), "--port", "22600"])
    except SystemExit as usage:  # a flag's own type refused it
        code = usage.code

    err = capsys.readouterr().err
    assert code in (1, 2) and "Traceback" not in err and "UTF-8" in err, err
    assert not (tmp_path / "d").exists(), "nothing was started or made"
