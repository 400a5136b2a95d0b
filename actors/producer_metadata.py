"""A producer's metadata (mixed into `ProducerClient`, actors/producer_client.py): which leader
each partition has, asked of the active controller one request at a time and asked again while
something is still wanted (the chase); the producer id an idempotent producer is numbered under;
and which voter to ask when one that does not lead answers."""

from __future__ import annotations

from actors.actor import MS
from actors.client_metadata import checked_topic, remember_topic
from actors.effects import Effect, Notify, Send, Trace
from actors.errors import ErrorCode
from actors.limits import FILE_NAME_BYTES_MAX
from actors.messages import (
    INT64_MAX, InitProducerIdRequest, InitProducerIdResponse, MetadataRequest, MetadataResponse,
    TopicMetadata,
)
from actors.producer_sequences import PRODUCER_EPOCH_MAX


# A name no batch needs stays wanted this long after it was last asked for: the shell's wait for a
# topic asks again at least every 0.5 s (railmq/producer.py `_wait_for_topic`), so a wait still
# going is never cut short, and once it ended (it raises at the first UNKNOWN_TOPIC_OR_PARTITION)
# the name is asked for at most 2 s more (40 requests at the chase's 50 ms), not for ever.
METADATA_WANTED_IDLE_MS = 2000


class ProducerMetadata:
    """Uses `ProducerClient`'s `controllers`, `settings`, `limits`, `topics`, `waiting`,
    `in_flight_count`, `correlation`, the metadata and producer-id fields, `unreachable`,
    `sequences` and `_dispatch`.

    What is wanted is bounded: `metadata_wanted` maps each name to when it was last wanted. A name
    no batch needs is forgotten once nobody asked for it for `METADATA_WANTED_IDLE_MS` (the
    shell's wait asks again while it waits; Kafka's producer forgets a topic unused for
    `metadata.max.idle.ms`), and past `client_metadata_topics_max` names the least recently wanted
    of them goes. A name that can be no topic (longer than a file name, which a replica's directory
    name holds) is answered unknown at once, never asked for. A request names the topics with
    batches first."""

    def _metadata_topics_max(self) -> int:
        """Names kept and asked for at once: never more than a controller takes in one request."""
        return min(self.limits.client_metadata_topics_max, self.limits.topics_max)

    def _topics_in_use(self) -> set[str]:
        """Topics with batches waiting or in flight: always wanted until known, asked for first."""
        return {topic for (topic, _), queue in self.waiting.items() if queue} | {
            topic for (topic, _), count in self.in_flight_count.items() if count}

    def _want(self, topics: list[str], now_ns: int) -> tuple[list[str], list[Effect]]:
        """Note that `topics` are wanted now (the most recently wanted last), within the bound.
        Returns the names that may be topics, and the answer for those that cannot."""
        longest = FILE_NAME_BYTES_MAX  # no cluster's topic, whatever its topic_name_length_max
        possible = [name for name in topics if len(name) <= longest]
        for name in possible:
            self.metadata_wanted.pop(name, None)
            self.metadata_wanted[name] = now_ns
        excess = len(self.metadata_wanted) - self._metadata_topics_max()
        if excess > 0:
            in_use = self._topics_in_use()
            for name in [name for name in self.metadata_wanted if name not in in_use][:excess]:
                del self.metadata_wanted[name]  # its caller's wait ends at max_block_ms: REQUEST_TIMED_OUT
        if len(possible) == len(topics):
            return possible, []
        return possible, [Notify("metadata", [TopicMetadata(
            name=name, error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            error_message=f"a topic name has at most {longest} characters, not {len(name)}")
            for name in dict.fromkeys(topics) if len(name) > longest])]

    def _forget_idle(self, now_ns: int) -> None:
        """Stop wanting what no batch needs and nobody asked for lately (the shell's wait for it
        ended, or it was answered unknown and nobody asked again)."""
        idle_ns = now_ns - METADATA_WANTED_IDLE_MS * MS
        stale = [name for name, wanted_ns in self.metadata_wanted.items() if wanted_ns <= idle_ns]
        if not stale:
            return
        in_use = self._topics_in_use()
        for name in stale:
            if name not in in_use:
                del self.metadata_wanted[name]
                topic = self.topics.get(name)
                if topic is not None and topic.error != ErrorCode.NONE:
                    del self.topics[name]  # what was learnt of it is no topic (or none yet)

    def _metadata_names(self) -> list[str]:
        """The names one request asks for: the topics with batches first (in turns, when they are
        more than a request holds), then the others, the most recently wanted first."""
        most = self._metadata_topics_max()
        in_use = self._topics_in_use()
        first = sorted(name for name in self.metadata_wanted if name in in_use)
        if len(first) > most:
            turn = (self.metadata_rounds * most) % len(first)
            first = first[turn:] + first[:turn]
        self.metadata_rounds += 1
        others = [name for name in reversed(self.metadata_wanted) if name not in in_use]
        return sorted((first + others)[:most])

    def _request_metadata(self, topics: list[str], now_ns: int, backoff: bool = False) -> list[Effect]:
        """Ask for metadata: one request at a time, and after an answer that did not help (no
        leader yet) not again before `retry_backoff_ms` when `backoff` (the chase asks again)."""
        topics, effects = self._want(topics, now_ns)
        if self.metadata_correlation and set(topics) <= self.metadata_asked:
            return effects  # the request in flight asks for them already (not one more per answer)
        if backoff and now_ns - self.metadata_answered_ns < self.settings.retry_backoff_ms * MS:
            return effects  # the chase asks for everything still wanted once the backoff has passed
        if not self.metadata_wanted:
            return effects
        self.correlation += 1
        self.metadata_correlation = self.correlation
        names = self._metadata_names()
        self.metadata_asked = set(names)
        request = MetadataRequest(correlation_id=self.correlation, topics=names)
        return effects + [Send(self.bootstrap, request)]

    def _on_metadata(self, response: MetadataResponse, now_ns: int) -> list[Effect]:
        self.controllers.learn(response.controller_endpoints)
        if 0 < response.correlation_id <= self.correlation:
            self.metadata_answered_ns = now_ns  # an earlier request's answer too: the backoff runs from it
        if response.correlation_id == self.metadata_correlation:
            self.metadata_correlation = 0
        effects: list[Effect] = []
        told: list[TopicMetadata] = []
        batches = self._topics_in_use()
        in_use = set(self.metadata_wanted) | batches
        for topic in response.topics:
            if topic.name not in in_use and topic.name not in self.topics:
                continue  # nobody asked about it: not kept (the map holds only topics in use)
            topic = checked_topic(topic)
            told.append(topic)
            if topic.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and topic.name not in batches:
                self.topics.pop(topic.name, None)  # no topic: the shell is told, nothing is kept
                continue
            remember_topic(self.topics, topic, in_use, self._metadata_topics_max())
            if topic.error == ErrorCode.NONE:
                self.metadata_wanted.pop(topic.name, None)
        effects.append(Notify("metadata", told))
        for key in list(self.waiting):
            effects += self._dispatch(key, now_ns)
        return effects

    def _on_producer_id(self, response: InitProducerIdResponse, now_ns: int) -> list[Effect]:
        if self.new_producer_id_correlation and response.correlation_id == self.new_producer_id_correlation:
            return self._on_new_producer_id(response, now_ns)
        if response.correlation_id != self.producer_id_correlation or self.producer_id >= 0:
            # A producer is numbered once: a late or duplicated answer would restart its
            # sequences under another id while batches numbered under the first are in flight.
            return []
        if not _usable_producer_id(response):
            # Asked again by the chase, not at once: a controller that keeps refusing (busy, not
            # ready) is asked once a chase interval, not once a round trip.
            return [Trace("producer-id-refused", {"error": response.error,
                                                  "producer_id": response.producer_id})]
        self.producer_id, self.sequences.base_epoch = response.producer_id, response.producer_epoch
        self.producer_secret = response.producer_secret
        effects: list[Effect] = []
        for key in list(self.waiting):
            effects += self._dispatch(key, now_ns)
        return effects

    def _on_new_producer_id(self, response: InitProducerIdResponse, now_ns: int) -> list[Effect]:
        """An id for the partitions whose producer epochs are spent: they go on under it."""
        if not _usable_producer_id(response):
            return [Trace("producer-id-refused", {"error": response.error,
                                                  "producer_id": response.producer_id})]
        self.new_producer_id_correlation = 0
        effects: list[Effect] = []
        for key in sorted(self.sequences.epochs_spent):
            self.sequences.move_to(key, response.producer_id, response.producer_secret,
                                   response.producer_epoch)
            effects += self._dispatch(key, now_ns)
        return effects

    def _refresh_when_old(self, now_ns: int) -> list[Effect]:
        """Ask for every known topic again once `metadata_max_age_ms` passed since they were last
        asked for (Kafka's metadata.max.age.ms). Otherwise metadata is asked for only when
        something is wrong, and a producer meeting no error never heard that its topic gained
        partitions: its keys went on to `hash % old count` for its whole life while a producer
        started later put them elsewhere, and its keyless records never reached the new ones."""
        if self.metadata_refreshed_ns < 0:
            self.metadata_refreshed_ns = now_ns
        if now_ns - self.metadata_refreshed_ns <= self.settings.metadata_max_age_ms * MS or not self.topics:
            return []
        self.metadata_refreshed_ns = now_ns
        return self._request_metadata(sorted(self.topics), now_ns)

    def _leader_endpoint(self, key: tuple[str, int], now_ns: int) -> str:
        topic = self.topics.get(key[0])
        if topic is None or not 0 <= key[1] < len(topic.partitions):
            return ""
        endpoint = topic.partitions[key[1]].leader_endpoint
        if self.unreachable.get(endpoint, 0) > now_ns:
            return ""  # metadata older than the disconnect we saw: wait for the new leader
        return endpoint

    def _forget_leader(self, key: tuple[str, int]) -> None:
        topic = self.topics.get(key[0])
        if topic is not None and 0 <= key[1] < len(topic.partitions):
            topic.partitions[key[1]].leader_endpoint = ""

    def _chase(self, now_ns: int) -> list[Effect]:
        """Ask again for what is still wanted: the previous answer may be lost or stale."""
        effects: list[Effect] = []
        self._forget_idle(now_ns)
        if self.metadata_wanted:
            if self.metadata_correlation:
                self.controllers.rotate()  # unanswered for a whole interval: that voter may be gone
            self.metadata_correlation = 0
            effects += self._request_metadata([], now_ns)
        if self.settings.idempotent and self.producer_id < 0:
            effects.append(Send(self.bootstrap,
                                InitProducerIdRequest(correlation_id=self.producer_id_correlation)))
        if self.sequences.epochs_spent and self.new_producer_id_correlation:
            effects.append(Send(self.bootstrap,
                                InitProducerIdRequest(correlation_id=self.new_producer_id_correlation)))
        return effects

    def _ask_controller_again(self, correlation_id: int, now_ns: int) -> list[Effect]:
        """A voter that does not lead answered: ask the one it named (or the next one)."""
        effects: list[Effect] = []
        # voters naming each other: asked again when the chase is due
        if not self.controllers.follow_at_once():
            if correlation_id == self.metadata_correlation:
                self.metadata_correlation = 0
            return effects
        if correlation_id == self.metadata_correlation:
            self.metadata_correlation = 0
            effects += self._request_metadata([], now_ns)
        if correlation_id == self.producer_id_correlation and self.producer_id < 0:
            effects.append(Send(self.bootstrap,
                                InitProducerIdRequest(correlation_id=self.producer_id_correlation)))
        return effects


def _usable_producer_id(response: InitProducerIdResponse) -> bool:
    """A success giving numbers a batch header holds: the id an int64, the epoch an int16. Others
    are refused as no answer (asked again by the chase): taken, an epoch of 32,768 failed every
    batch as one that cannot be encoded, and renumbering a batch under it ended the I/O thread."""
    return response.error == ErrorCode.NONE and 0 <= response.producer_id <= INT64_MAX \
        and 0 <= response.producer_epoch <= PRODUCER_EPOCH_MAX
