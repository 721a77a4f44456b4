# SPDX-License-Identifier: Apache-2.0
"""libte: zero-copy, batched, asynchronous transfers between the registered memory
of processes on many hosts.

    import libte

    with libte.Engine("P2PHANDSHAKE", "127.0.0.1", transports="tcp") as engine:
        buf = bytearray(1 << 20)
        engine.register(buf)
        with engine.open_segment("10.0.0.1:15123") as peer:
            remote = peer.buffers()[0].addr
            engine.write(peer, buf, remote)          # buf -> peer
            engine.read(peer, buf, remote)           # peer -> buf

Every call that can block releases the GIL. Errors raise libte.Error subclasses
that carry libte's code (``err.code``) and the line libte logged (``err.detail``).
``libte.mooncake.TransferEngine`` is a drop-in for Mooncake's Python class.
"""

import enum as _enum
from typing import NamedTuple as _NamedTuple


def _load_bundled_libte():
    # A wheel carries libte in .libte.mesonpy.libs beside this package, as
    # libte.so.<version> (the wheel holds no symbolic links), with its
    # plugins in te-1 next to it, where libte looks for them. Loaded here
    # first, it is the libte.so.1 that _native needs (the dynamic linker
    # matches the soname of a loaded library). A system or build-tree
    # install has no such folder and links libte the usual way.
    import ctypes
    import os

    libs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        ".libte.mesonpy.libs")
    try:
        names = sorted(n for n in os.listdir(libs) if n.startswith("libte.so.1"))
    except OSError:
        return None
    if not names:
        return None
    return ctypes.CDLL(os.path.join(libs, names[0]))


_bundled_libte = _load_bundled_libte()

from . import _native  # noqa: E402  (after the bundled libte)
from ._native import (  # noqa: F401,E402  (re-exported)
    ABI_MAJOR,
    ABI_MINOR,
    LOCAL_SEGMENT,
    NOTIFY_MAX,
    READ,
    TASK_ENDED_EARLY,
    TASK_UNSETTLED,
    WRITE,
    AddressError,
    AuthError,
    Batch,
    BatchError,
    BatchFullError,
    BusyError,
    ClosedError,
    ConnectionError,
    Engine,
    Error,
    InvalidArgumentError,
    Memory,
    MetadataError,
    NoTransportError,
    NotFoundError,
    NotSupportedError,
    Notification,
    OverlapError,
    PluginError,
    PluginInfo,
    ProtocolError,
    RejectedError,
    Segment,
    SegmentBuffer,
    SegmentError,
    TaskInfo,
    TaskStatus,
    XferList,
    TimeoutError,
    TransferError,
    buffer_address,
    device_alloc,
    device_copy,
    device_free,
    device_locate,
    device_stream_wait,
    get_log_level,
    now_ns,
    plugin_report,
    plugins,
    segment_key,
    set_log_level,
    strerror,
    version,
)

__version__ = version()


class Opcode(_enum.IntEnum):
    """What a request does."""

    READ = READ  #: segment -> local memory
    WRITE = WRITE  #: local memory -> segment


class TaskState(_enum.IntEnum):
    """A task's state; the numbers are Mooncake's."""

    WAITING = 0
    PENDING = 1
    INVALID = 2
    CANCELED = 3
    COMPLETED = 4
    TIMEOUT = 5
    FAILED = 6


class Request(_NamedTuple):
    """One transfer: for Batch.submit() and Engine.transfer().

    ``local`` is an address in registered memory or a registered buffer object;
    ``remote`` an address in the segment's owner (a byte offset for file
    segments); ``length`` may be None when ``local`` is a buffer (its length).
    """

    opcode: int
    segment: object
    local: object
    remote: int
    length: object = None

    @classmethod
    def read(cls, segment, local, remote, length=None):
        """A READ: ``length`` bytes at ``remote`` in ``segment`` into ``local``."""
        return cls(READ, segment, local, remote, length)

    @classmethod
    def write(cls, segment, local, remote, length=None):
        """A WRITE: ``length`` bytes from ``local`` to ``remote`` in ``segment``."""
        return cls(WRITE, segment, local, remote, length)


ERROR_CODES = {
    name[4:]: getattr(_native, name) for name in dir(_native) if name.startswith("ERR_")
}
"""libte's own error codes by name (PLUGIN, NO_TRANSPORT, ...)."""

__all__ = [
    "Engine", "Segment", "Batch", "Memory", "XferList", "Request", "Opcode", "TaskState", "TaskStatus",
    "TaskInfo", "TASK_UNSETTLED", "TASK_ENDED_EARLY", "Notification", "SegmentBuffer", "PluginInfo", "READ", "WRITE", "LOCAL_SEGMENT",
    "NOTIFY_MAX", "Error", "ClosedError", "TransferError", "InvalidArgumentError",
    "TimeoutError", "BusyError", "NotFoundError", "ConnectionError", "NotSupportedError",
    "PluginError", "NoTransportError", "MetadataError", "ProtocolError", "RejectedError",
    "BatchFullError", "AddressError", "OverlapError", "SegmentError", "BatchError", "AuthError",
    "version", "now_ns", "strerror", "set_log_level", "get_log_level", "plugins", "plugin_report",
    "segment_key", "buffer_address", "device_alloc", "device_free", "device_copy",
    "device_locate", "device_stream_wait", "ERROR_CODES",
]
