"""Message authentication between the processes of one cluster.

Every process a cluster starts (coordinator, group coordinator, replicas, node agent, the chaos
harness of that cluster) holds the cluster secret: 32 random bytes created with the cluster in
`<data dir>/cluster.secret` (mode 0600) and handed to each actor in its spec over the supervisor's
pipe, never over a socket. Each message such a process sends carries one more frame after its
payload frames, the tag:

    b"RMQ1" | BLAKE2b-256(key = secret, frame 0 | u64 length of each payload frame)

Receivers that need to know a message comes from inside the cluster (the coordinator's partition
states and stop notices, ISR changes, replica heartbeats and fetches, process-exit notices, the
fault switch) check it; clients hold no secret and send no tag, so a client can read and write
topics but cannot pose as a follower, a coordinator or the chaos harness. Which messages need the
tag is each actor's rule (`needs_authentication`, a pure method), applied by the runtime and by the
simulator alike (`refusal` below).

The tag covers frame 0 — every field of the message — and the lengths of the payload frames, not
their bytes: record batches carry their own CRC-32, and MACing every replicated byte would cost
replication throughput for an attacker who could not read the socket anyway (loopback traffic is
not visible to an unprivileged process). docs/security.md says what this does and does not stop.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from typing import Any, Sequence

from actors.errors import ErrorCode
from actors.messages import ErrorResponse

TAG_MAGIC = b"RMQ1"
TAG_DIGEST_BYTES = 32
TAG_BYTES = len(TAG_MAGIC) + TAG_DIGEST_BYTES
SECRET_BYTES = 32
_LENGTH = struct.Struct("<Q")


class Signer:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("a cluster secret has at least 16 bytes")
        self._secret = bytes(secret)
        # Keying BLAKE2b costs a compression of its own: each message copies a keyed state instead.
        self._keyed = hashlib.blake2b(key=self._secret, digest_size=TAG_DIGEST_BYTES)

    def _digest(self, frames: Sequence[Any]) -> bytes:
        digest = self._keyed.copy()
        digest.update(_view(frames[0]))
        for frame in frames[1:]:
            digest.update(_LENGTH.pack(len(_view(frame))))
        return digest.digest()

    def tag(self, frames: Sequence[Any]) -> bytes:
        return TAG_MAGIC + self._digest(frames)

    def verify(self, frames: Sequence[Any]) -> bool:
        """`frames` ends with a tag frame; True when it is this cluster's tag of the others."""
        tag = bytes(_view(frames[-1]))
        if len(tag) != TAG_BYTES or not tag.startswith(TAG_MAGIC):
            return False
        return hmac.compare_digest(tag[len(TAG_MAGIC):], self._digest(frames[:-1]))


def looks_like_tag(frame: Any) -> bool:
    view = _view(frame)
    return len(view) == TAG_BYTES and bytes(view[:len(TAG_MAGIC)]) == TAG_MAGIC


def _view(frame: Any) -> Any:
    return getattr(frame, "buffer", frame)


def new_secret() -> bytes:
    return os.urandom(SECRET_BYTES)


def refusal(actor: Any, message: Any, authenticated: bool) -> ErrorResponse | None:
    """The answer to a message the actor accepts only from inside the cluster and that did not
    prove it; None when the message may be handled."""
    if authenticated:
        return None
    needs = getattr(actor, "needs_authentication", None)
    if needs is None or not needs(message):
        return None
    return ErrorResponse(
        correlation_id=getattr(message, "correlation_id", -1), error=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        error_message=(f"{type(message).__name__} is accepted only from a process of this cluster "
                       "(it carries no valid authentication tag); nothing was changed"))
