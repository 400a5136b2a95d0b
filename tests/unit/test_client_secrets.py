"""Client secrets (actors/client_secrets.py): what a member or a producer proves itself with."""

from __future__ import annotations

from actors.client_secrets import SECRET_BYTES, MemberSecrets, ProducerSecrets

KEY = bytes(range(32))


def test_a_secret_is_the_same_wherever_it_is_derived_under_the_clusters_key():
    assert MemberSecrets(KEY).of("g", "a-1") == MemberSecrets(KEY).of("g", "a-1")
    assert ProducerSecrets(KEY).proves(7, ProducerSecrets(KEY).of(7))
    assert len(MemberSecrets(KEY).of("g", "a-1")) == len(ProducerSecrets(KEY).of(7)) == SECRET_BYTES


def test_another_key_another_identity_or_another_kind_of_identity_does_not_prove_it():
    member = MemberSecrets(KEY).of("g", "a-1")

    assert not MemberSecrets(b"another cluster").proves("g", "a-1", member)
    assert not MemberSecrets(KEY).proves("g", "a-2", member)
    assert not MemberSecrets(KEY).proves("h", "a-1", member)
    assert not ProducerSecrets(KEY).proves(1, MemberSecrets(KEY).of("", "\x00\x00\x00\x00\x00\x00\x00\x01"))
    assert not ProducerSecrets(KEY).proves(7, ProducerSecrets(KEY).of(8))
    assert not ProducerSecrets(KEY).proves(7, b"")


def test_where_the_group_id_ends_and_the_member_id_begins_is_part_of_the_secret():
    """A client that may name its own group and client id cannot make its pair read as another."""
    secrets = MemberSecrets(KEY)

    assert secrets.of("ab", "c") != secrets.of("a", "bc")
    assert not secrets.proves("a", "bc", secrets.of("ab", "c"))
