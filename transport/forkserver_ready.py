"""Imported last by the forkserver (transport/supervisor.py's preload list): the server's objects
are frozen out of the garbage collector's reach.

Every actor process is forked from the forkserver and shares its memory pages until it writes
to them. A garbage collection in a child walks every tracked object and writes to each one's
header, copying every page of the preloaded modules into that child. `gc.freeze()` moves the
objects that exist now into a permanent generation the collector never visits, so those pages
stay shared (CPython's advice for pre-fork servers); only objects a child creates or touches are
its own. What every actor would build for itself on start (the message decoder) is built here first.
"""

import gc

from transport.codec import message_decoder

message_decoder()  # msgspec's type information for every message, shared by every actor
gc.freeze()
