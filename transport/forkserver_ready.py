"""Imported last by the forkserver (transport/supervisor.py's preload list): the server's objects
are frozen out of the garbage collector's reach, and its children do not run the main script again.

Every actor process is forked from the forkserver and shares its memory pages until it writes
to them. A garbage collection in a child walks every tracked object and writes to each one's
header, copying every page of the preloaded modules into that child. `gc.freeze()` moves the
objects that exist now into a permanent generation the collector never visits, so those pages
stay shared (CPython's advice for pre-fork servers); only objects a child creates or touches are
its own. What every actor would build for itself on start (the message decoder) is built here first.

multiprocessing makes each forked child import the parent's main script again (so that objects
defined there can be unpickled), after the fork, each copy its own: under pytest or `railmq up`
that is a few MB of modules per actor, and a script that starts a cluster at import time would
start one from every child. Every process this forkserver starts runs railmq's own code (an
actor: transport.actor_main.main; a chaos worker: chaos/workload.py), pickled by module name,
and never needs the user's script: its children keep the server's `__main__` and skip that step.
Everything else `spawn.prepare` does (the parent's sys.path, working directory, process name,
authentication key) is kept.
"""

import gc
from multiprocessing import spawn

from transport.codec import message_decoder

_MAIN_KEYS = ("init_main_from_name", "init_main_from_path")
_prepare = spawn.prepare


def prepare_without_main(data: dict) -> None:
    _prepare({key: value for key, value in data.items() if key not in _MAIN_KEYS})


spawn.prepare = prepare_without_main  # what forkserver's children call (multiprocessing.spawn._main)
message_decoder()  # msgspec's type information for every message, shared by every actor
gc.freeze()
