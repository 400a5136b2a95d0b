"""CRC-32 (the zlib polynomial), as fast as this machine allows.

Every byte railmq stores or moves is checksummed at least twice (producer and leader, then
leader reads and consumers), so the CRC is on the hottest path there is. ISA-L's CRC-32
(`isal` package) runs at ~45 GB/s here against zlib's ~3.4 GB/s and gives identical values;
when it is not installed the standard library's zlib is used. Same function, same results.
"""

from __future__ import annotations

try:
    from isal.isal_zlib import crc32
    IMPLEMENTATION = "isal"
except ImportError:  # pragma: no cover - depends on the platform's wheels
    from zlib import crc32
    IMPLEMENTATION = "zlib"

__all__ = ["crc32", "IMPLEMENTATION"]
