"""Topic settings given to `Admin` by name are checked before anything is sent (railmq/admin.py).

The wire's decoder drops fields it does not know, so a misspelt setting never reached the
coordinator to be refused: `create_topic(..., {"min_insync_replica": 2})` made a topic of min
in-sync 1, where acks=all acknowledges a record one copy holds.
"""

from __future__ import annotations

import pytest

from actors.errors import ErrorCode, RailmqError
from railmq.admin import Admin, topic_config

NOBODY = "tcp://127.0.0.1:1"  # nothing is asked: the settings are refused first


@pytest.mark.parametrize("settings", [{"min_insync_replica": 2}, {"retention_mss": 1_000, "retention_ms": 5}])
def test_a_setting_name_the_topic_does_not_have_is_refused_naming_it(settings):
    with Admin(NOBODY, timeout_ms=100) as admin, pytest.raises(RailmqError) as refused:
        admin.create_topic("orders", 1, 3, settings)

    assert refused.value.code == ErrorCode.INVALID_CONFIG
    assert next(name for name in settings if name.endswith(("replica", "mss"))) in str(refused.value)


@pytest.mark.parametrize("settings", [{"retention_ms": "a week"}, {"min_insync_replicas": 2.5},
                                      {"unclean_leader_election": "yes"}])
def test_a_value_of_the_wrong_type_is_refused_as_a_typed_error_not_a_validation_traceback(settings):
    with pytest.raises(RailmqError) as refused:
        topic_config(settings)

    assert refused.value.code == ErrorCode.INVALID_CONFIG


def test_known_settings_are_taken():
    assert topic_config({"min_insync_replicas": 2, "retention_ms": None}).min_insync_replicas == 2
