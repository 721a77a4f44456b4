# SPDX-License-Identifier: Apache-2.0
"""Mooncake's Python ``TransferEngine`` on libte.

Code written for ``from mooncake.engine import TransferEngine`` runs with::

    from libte.mooncake import TransferEngine

The class has Mooncake's method names, arguments and return conventions: most
methods return 0 on success and a negative number on failure (the reason goes
to the ``libte.mooncake`` logger and to libte's log), batch ids are ints, and
bad input gives an error return, never a crash. What differs, and why, is listed
in docs/mooncake-compat.md.
"""

import enum
import errno
import json
import logging
import os
import threading
import time
from typing import Dict, List, Optional, Sequence

import libte

__all__ = [
    "TransferEngine", "TransferOpcode", "TransferNotify", "Read", "Write",
    "SUPPORT_CUDA", "SUPPORT_EFA", "SUPPORT_HIP", "SUPPORT_MUSA", "SUPPORT_MNNVL", "SUPPORT_INTRA_NVLINK",
]

_log = logging.getLogger("libte.mooncake")

# What this build offers, under the names Mooncake's module uses.
SUPPORT_CUDA = False
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MUSA = False
SUPPORT_MNNVL = False
SUPPORT_INTRA_NVLINK = False

P2PHANDSHAKE = "P2PHANDSHAKE"


class TransferOpcode(enum.IntEnum):
    """Read (segment -> local) and Write (local -> segment), as Mooncake numbers them."""

    Read = 0
    Write = 1


Read = TransferOpcode.Read
Write = TransferOpcode.Write


class TransferNotify:
    """A notification: ``name`` (the sender's, as it chose) and ``msg``."""

    __slots__ = ("name", "msg")

    def __init__(self, name: str = "", msg: str = ""):
        self.name = name
        self.msg = msg

    def __repr__(self):
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"

    def __eq__(self, other):
        return isinstance(other, TransferNotify) and (self.name, self.msg) == (other.name, other.msg)


# Mooncake's error.h codes, for the methods that return them: the same table
# as libtransfer_engine's (docs/mooncake-compat.md); anything else is -1.
_ERR_INVALID_ARGUMENT = -1
_MOONCAKE_ERRORS = {
    libte.ERROR_CODES["BATCH_FULL"]: -2, -errno.ENOSPC: -2,    # ERR_TOO_MANY_REQUESTS
    libte.ERROR_CODES["ADDRESS"]: -3,                          # ERR_ADDRESS_NOT_REGISTERED
    -errno.EBUSY: -4,                                          # ERR_BATCH_BUSY
    libte.ERROR_CODES["NO_TRANSPORT"]: -6,                     # ERR_DEVICE_NOT_FOUND
    libte.ERROR_CODES["PLUGIN"]: -6,
    libte.ERROR_CODES["OVERLAP"]: -7,                          # ERR_ADDRESS_OVERLAPPED
    **{-c: -102 for c in (errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED,
                          errno.EHOSTUNREACH, errno.EHOSTDOWN, errno.ENETUNREACH, errno.ENETDOWN,
                          errno.ENOTCONN, errno.EPIPE, errno.ETIMEDOUT, errno.EADDRINUSE,
                          errno.EADDRNOTAVAIL, errno.EIO)},   # ERR_SOCKET
    libte.ERROR_CODES["PROTOCOL"]: -103,                       # ERR_MALFORMED_JSON
    libte.ERROR_CODES["REJECTED"]: -104,                       # ERR_REJECT_HANDSHAKE
    libte.ERROR_CODES["METADATA"]: -200,                       # ERR_METADATA
    -errno.ESHUTDOWN: -202, -errno.ECANCELED: -202,            # ERR_CONTEXT
    -errno.ENOMEM: -302,                                       # ERR_MEMORY
    -errno.ENOTSUP: -303,                                      # ERR_NOT_IMPLEMENTED
}


def _mooncake_code(err: libte.Error) -> int:
    return _MOONCAKE_ERRORS.get(getattr(err, "code", 0), _ERR_INVALID_ARGUMENT)


# Managed buffers: Mooncake's size classes (8 KiB .. 256 MiB, doubling), carved
# out of 2 GiB registered regions; larger requests get a region of their own.
_SLAB_KB = [8 << i for i in range(16)]
_MAX_CLASS = len(_SLAB_KB) - 1
_REGION = 2 << 30


def _class_of(size: int) -> int:
    for i, kb in enumerate(_SLAB_KB):
        if size <= kb * 1024:
            return i
    return -1


def _slice_timeout() -> int:
    """MC_SLICE_TIMEOUT: seconds (1..65535, as Mooncake), the deadline of every
    task this layer submits, counted from its submit; 0 (off) when unset or
    out of range."""
    env = os.environ.get("MC_SLICE_TIMEOUT")
    if not env:
        return 0
    try:
        v = int(env)
    except ValueError:
        v = 0
    if not 0 < v < 65536:
        _log.warning("ignoring MC_SLICE_TIMEOUT=%r: not a number of seconds in [1, 65535]", env)
        return 0
    return v


def _split_host_port(name: str):
    """('host', 'port' or None); IPv6 in brackets."""
    if name.startswith("["):
        end = name.find("]")
        if end > 0:
            rest = name[end + 1:]
            return name[1:end], (rest[1:] if rest.startswith(":") else None)
    if name.count(":") == 1:
        host, port = name.split(":")
        return host, port
    return name, None


def _with_opcode(method: str, opcode: TransferOpcode):
    """Mooncake's _write and _read forms of a batch call: `method` of the
    engine with its opcode given."""
    def call(self, target_hostname: str, buffers: Sequence[int], peer_buffer_addresses: Sequence[int],
             lengths: Sequence[int], transport_hint: str = "") -> int:
        return getattr(self, method)(target_hostname, buffers, peer_buffer_addresses, lengths, opcode)
    call.__name__ = call.__qualname__ = f"{method}_{opcode.name.lower()}"
    return call


class TransferEngine:
    """Mooncake's ``TransferEngine`` Python class, backed by a libte Engine."""

    TransferOpcode = TransferOpcode

    def __init__(self):
        self._engine: Optional[libte.Engine] = None
        self._lock = threading.Lock()
        self._segments: Dict[str, libte.Segment] = {}
        self._batches: Dict[int, tuple] = {}  # id -> (Batch, deadline)
        self._streamed: List[tuple] = []  # (Batch, call, target) of the *_on_cuda calls
        self._free: List[List[int]] = [[] for _ in _SLAB_KB]
        self._regions: List[libte.Memory] = []
        self._large: Dict[int, libte.Memory] = {}
        self._owned: Dict[int, int] = {}  # managed block address -> class
        self._slice_timeout = _slice_timeout()
        env = os.environ.get("MC_TRANSFER_TIMEOUT")
        try:
            self._timeout = max(5, int(env)) if env else 30
        except ValueError:
            _log.warning("MC_TRANSFER_TIMEOUT=%r is not a number of seconds; using 30", env)
            self._timeout = 30

    # ------------------------------------------------------------ life cycle

    def initialize(self, local_hostname: str, metadata_server: str, protocol: str,
                   device_name: str) -> int:
        """Starts the engine: ``metadata_server`` is "P2PHANDSHAKE", "etcd://h:p",
        "redis://h:p", "http://h:p/path" or a bare "h:p" (etcd). 0 or -1."""
        if not isinstance(metadata_server, str):
            _log.error("initialize(): metadata_server must be a str")
            return -1
        if "://" in metadata_server:
            mtype, server = metadata_server.split("://", 1)
        elif metadata_server == P2PHANDSHAKE:
            mtype, server = "", P2PHANDSHAKE
        else:
            mtype, server = "etcd", metadata_server
        return self.initialize_ext(local_hostname, server, protocol, device_name, mtype)

    def initialize_ext(self, local_hostname: str, metadata_server: str, protocol: str,
                       device_name: str, metadata_type: str) -> int:
        """initialize() with the store's type apart ("etcd", "redis", "http"). 0 or -1."""
        if protocol == "xgmi":
            _log.error("protocol 'xgmi' is not offered through this API")
            return -1
        if not isinstance(local_hostname, str) or not local_hostname:
            _log.error("initialize(): local_hostname must be a non-empty str")
            return -1
        if metadata_server == P2PHANDSHAKE:
            conn = P2PHANDSHAKE
        elif "://" in metadata_server:
            conn = metadata_server
        else:
            conn = f"{metadata_type}://{metadata_server}"
        options = {}
        if not os.environ.get("MC_LEGACY_RPC_PORT_BINDING"):
            # The RPC port is a free one, as Mooncake binds; only the legacy
            # mode takes it from the name.
            if conn == P2PHANDSHAKE:
                host, _ = _split_host_port(local_hostname)
                local_hostname = f"[{host}]" if ":" in host else host
            options["rpc_port"] = "0"
            # With a metadata store Mooncake publishes MC_TCP_BIND_ADDRESS, when
            # set, as the address peers reach this engine at (not the name's host).
            bind = os.environ.get("MC_TCP_BIND_ADDRESS")
            if conn != P2PHANDSHAKE and bind:
                options["ip_or_host_name"] = bind
        if self._engine is not None:
            self._close()
        try:
            engine = libte.Engine(conn, local_hostname, options=options)
        except libte.Error as e:
            _log.error("initialize(%r, %r): %s", local_hostname, conn, e)
            return -1
        try:
            self._install(engine, protocol, device_name)
        except libte.Error as e:
            _log.error("initialize(): no transport: %s", e)
            engine.close()
            return -1
        self._engine = engine
        return 0

    @staticmethod
    def _install(engine: libte.Engine, protocol: str, device_name: str):
        proto = (protocol or "").lower()
        if os.environ.get("MC_FORCE_TCP"):
            proto = "tcp"
        if proto == "rdma":
            args = json.dumps({"devices": device_name}) if device_name else None
            try:
                engine.install("rdma", args)
                return
            except libte.Error as e:
                # Mooncake's auto-discovery does the same on a host without NICs.
                _log.warning("RDMA not usable here (%s); using TCP", e)
                engine.install("tcp")
                return
        if proto in ("tcp", "nvmeof") or any(p.name == proto and p.loaded for p in libte.plugins()):
            engine.install(proto)
            return
        if proto:
            _log.warning("protocol %r is not available in libte; installing the best transport found",
                         protocol)
        engine.install_auto()

    def _close(self):
        with self._lock:
            engine, self._engine = self._engine, None
            segments, self._segments = self._segments, {}
            self._batches.clear()
            streamed, self._streamed = self._streamed, []
            regions, self._regions = self._regions, []
            large, self._large = self._large, {}
            self._free = [[] for _ in _SLAB_KB]
            self._owned.clear()
        for s in segments.values():
            s.close()
        if engine is not None:
            engine.close()  # releases the registered regions; cancels what no stream reached
        del streamed  # after the engine: until then a stream may still hold them
        for m in regions + list(large.values()):
            m.close()

    def close(self):
        """Shuts the engine down (also when the object is collected). Not in Mooncake's API."""
        self._close()

    def __del__(self):
        try:
            self._close()
        except Exception:  # interpreter shutdown
            pass

    def _eng(self, what: str) -> Optional[libte.Engine]:
        if self._engine is None:
            _log.error("%s: the engine is not initialized", what)
        return self._engine

    def get_rpc_port(self) -> int:
        """The engine's RPC port (-1 before initialize())."""
        e = self._eng("get_rpc_port")
        return e.rpc_port if e else -1

    def get_engine(self):
        raise libte.NotSupportedError(
            "get_engine(): Mooncake's internal C++ engine object does not exist here")

    def get_engine_ptr(self):
        raise libte.NotSupportedError(
            "get_engine_ptr(): Mooncake's internal C++ engine object does not exist here")

    # -------------------------------------------------------------- segments

    def _segment(self, target: str) -> Optional[libte.Segment]:
        seg = self._segments.get(target)
        if seg is not None:
            return seg
        e = self._eng("transfer")
        if e is None:
            return None
        try:
            seg = e.open_segment(target)
        except (libte.Error, TypeError) as err:
            _log.error("cannot open segment %r: %s", target, err)
            return None
        with self._lock:
            kept = self._segments.setdefault(target, seg)
        if kept is not seg:
            seg.close()
        return kept

    def _forget(self, target: str, err: Exception):
        """After a failure that may mean the peer restarted: the next transfer
        opens the segment afresh (Mooncake drops its cached handle too)."""
        if isinstance(err, (libte.AddressError, libte.InvalidArgumentError, TypeError, ValueError)):
            return
        with self._lock:
            seg = self._segments.pop(target, None)
        if seg is not None:
            seg.close()

    def get_first_buffer_address(self, segment_name: str) -> int:
        """The address of the segment's first buffer (lowest address), 0 when it has none."""
        seg = self._segment(segment_name)
        if seg is None:
            return 0
        try:
            bufs = seg.buffers()
        except libte.Error as e:
            _log.error("get_first_buffer_address(%r): %s", segment_name, e)
            return 0
        return bufs[0].addr if bufs else 0

    def send_probe(self, peer_server_name: str) -> int:
        """0 when the peer answers, -1 otherwise."""
        e = self._eng("send_probe")
        if e is None:
            return -1
        try:
            e.probe(peer_server_name, timeout=5.0)
            return 0
        except (libte.Error, TypeError) as err:
            _log.warning("send_probe(%r): %s", peer_server_name, err)
            return -1

    def warmup_efa_segment(self, segment_name: str) -> int:
        """Accepted without effect: there is no EFA transport (0, as Mooncake without EFA)."""
        return 0

    def get_local_topology(self, device_name: Optional[str] = None) -> str:
        """The RDMA NIC priority matrix of this host as JSON ("{}" without RDMA devices)."""
        args = json.dumps({"devices": device_name}) if device_name else None
        try:
            with libte.Engine(P2PHANDSHAKE, "127.0.0.1") as probe:
                probe.install("rdma", args)
                desc = json.loads(probe.descriptor())  # bounded: libte checked it (te-json.h)
                return json.dumps(desc.get("priority_matrix", {}))
        except libte.Error as e:
            _log.info("get_local_topology(): no RDMA topology: %s", e)
            return "{}"

    # --------------------------------------------------------------- memory

    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        """Registers [buffer_addr, +capacity) for peers to read and write. 0 or a negative code."""
        e = self._eng("register_memory")
        if e is None:
            return _ERR_INVALID_ARGUMENT
        try:
            e.register(int(buffer_addr), int(capacity), location=location)
            return 0
        except libte.Error as err:
            _log.error("register_memory(0x%x, %d): %s", buffer_addr, capacity, err)
            return _mooncake_code(err)
        except (TypeError, ValueError, OverflowError) as err:
            _log.error("register_memory(): %s", err)
            return _ERR_INVALID_ARGUMENT

    def unregister_memory(self, buffer_addr: int) -> int:
        """0 or a negative code."""
        e = self._eng("unregister_memory")
        if e is None:
            return _ERR_INVALID_ARGUMENT
        try:
            e.unregister(int(buffer_addr))
            return 0
        except libte.Error as err:
            _log.error("unregister_memory(0x%x): %s", buffer_addr, err)
            return _mooncake_code(err)
        except (TypeError, ValueError, OverflowError) as err:
            _log.error("unregister_memory(): %s", err)
            return _ERR_INVALID_ARGUMENT

    def batch_register_memory(self, buffer_addresses: Sequence[int], capacities: Sequence[int],
                              location: str = "*") -> int:
        """All or nothing. 0 or a negative code."""
        e = self._eng("batch_register_memory")
        if e is None:
            return _ERR_INVALID_ARGUMENT
        try:
            if len(buffer_addresses) != len(capacities):
                _log.error("batch_register_memory(): %d addresses but %d capacities",
                           len(buffer_addresses), len(capacities))
                return _ERR_INVALID_ARGUMENT
            e.register_many([(int(a), int(c)) for a, c in zip(buffer_addresses, capacities)],
                            location=location)
            return 0
        except libte.Error as err:
            _log.error("batch_register_memory(): %s", err)
            return _mooncake_code(err)
        except (TypeError, ValueError, OverflowError) as err:
            _log.error("batch_register_memory(): %s", err)
            return _ERR_INVALID_ARGUMENT

    def batch_unregister_memory(self, buffer_addresses: Sequence[int]) -> int:
        """0, or the code of the first failure (the others are still unregistered)."""
        rc = 0
        for a in buffer_addresses:
            r = self.unregister_memory(a)
            rc = rc or r
        return rc

    def allocate_managed_buffer(self, length: int) -> int:
        """A registered block of at least ``length`` bytes from the engine's pool; 0 on failure."""
        e = self._eng("allocate_managed_buffer")
        if e is None:
            return 0
        try:
            length = int(length)
        except (TypeError, ValueError):
            _log.error("allocate_managed_buffer(): length must be an int")
            return 0
        if length <= 0:
            _log.error("allocate_managed_buffer(%d): length must be positive", length)
            return 0
        cls = _class_of(length)
        with self._lock:
            try:
                if cls < 0:
                    mem = libte.Memory(length)
                    e.register(mem)
                    self._large[mem.address] = mem
                    return mem.address
                if not self._free[cls] and not self._split(e, cls):
                    return 0
                addr = self._free[cls].pop()
                self._owned[addr] = cls
                return addr
            except (libte.Error, MemoryError, OSError) as err:
                _log.error("allocate_managed_buffer(%d): %s", length, err)
                return 0

    def _split(self, e: libte.Engine, cls: int) -> bool:
        """Refills free list ``cls`` by halving a block of the next class up
        (a new 2 GiB region at the top). Lock held."""
        if cls == _MAX_CLASS:
            mem = libte.Memory(_REGION)
            e.register(mem)
            self._regions.append(mem)
            step = _SLAB_KB[_MAX_CLASS] * 1024
            self._free[cls].extend(range(mem.address, mem.address + _REGION, step))
            return True
        if not self._free[cls + 1] and not self._split(e, cls + 1):
            return False
        block = self._free[cls + 1].pop()
        self._free[cls] += [block, block + _SLAB_KB[cls] * 1024]
        return True

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        """Returns a block from allocate_managed_buffer(). 0, or -1 for an address it did not give."""
        with self._lock:
            mem = self._large.pop(buffer_addr, None)
            if mem is None:
                cls = self._owned.pop(buffer_addr, None)
                if cls is None:
                    _log.error("free_managed_buffer(0x%x): not a managed buffer of this engine", buffer_addr)
                    return -1
                if _class_of(int(length)) != cls:
                    _log.warning("free_managed_buffer(0x%x, %d): allocated for another size", buffer_addr,
                                 length)
                self._free[cls].append(buffer_addr)
                return 0
        try:
            if self._engine is not None:
                self._engine.unregister(mem)
            mem.close()
        except libte.Error as err:
            _log.error("free_managed_buffer(0x%x): %s", buffer_addr, err)
            return -1
        return 0

    def write_bytes_to_buffer(self, dest_address: int, src_ptr: bytes, length: int) -> int:
        """Copies ``length`` bytes of ``src_ptr`` into registered memory. 0, or -1 when
        the range is not inside a registration of this engine."""
        e = self._eng("write_bytes_to_buffer")
        if e is None:
            return -1
        try:
            data = memoryview(src_ptr).cast("B")
            if length < 0 or length > len(data):
                _log.error("write_bytes_to_buffer(): length %d but %d bytes given", length, len(data))
                return -1
            e.write_bytes(dest_address, data[:length])
            return 0
        except (libte.Error, TypeError, ValueError) as err:
            _log.error("write_bytes_to_buffer(0x%x): %s", dest_address, err)
            return -1

    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        """A bytes copy of registered memory (empty bytes when the range is not registered)."""
        e = self._eng("read_bytes_from_buffer")
        if e is None:
            return b""
        try:
            return e.read_bytes(source_address, length)
        except (libte.Error, TypeError, ValueError) as err:
            _log.error("read_bytes_from_buffer(0x%x): %s", source_address, err)
            return b""

    # ------------------------------------------------------------ transfers

    def _deadline(self, total: int) -> float:
        # Mooncake's budget: the timeout plus a nanosecond per byte (1 GiB/s).
        return self._timeout + total / 1e9

    def _sync_timeout(self, total: int) -> float:
        """The bound of a synchronous call, in seconds: Mooncake's budget, or
        MC_SLICE_TIMEOUT when that is set and sooner (the tasks' deadline)."""
        t = self._deadline(total)
        return min(t, self._slice_timeout) if self._slice_timeout else t

    def _task_deadline(self) -> Optional[int]:
        """The deadline (libte.now_ns()) of tasks submitted now: MC_SLICE_TIMEOUT
        from now, or None without it."""
        return libte.now_ns() + self._slice_timeout * 1_000_000_000 if self._slice_timeout else None

    def transfer_sync(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                      length: int, opcode: TransferOpcode,
                      notify: Optional[TransferNotify] = None, transport_hint: str = "") -> int:
        """One transfer, waited for; ``notify`` is sent to the target when it is done. 0 or -1."""
        return self.batch_transfer_sync(target_hostname, [buffer], [peer_buffer_address], [length],
                                        opcode, notify, transport_hint)

    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                            length: int, transport_hint: str = "") -> int:
        return self.transfer_sync(target_hostname, buffer, peer_buffer_address, length, Write)

    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                           length: int, transport_hint: str = "") -> int:
        return self.transfer_sync(target_hostname, buffer, peer_buffer_address, length, Read)

    def batch_transfer_sync(self, target_hostname: str, buffers: Sequence[int],
                            peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                            opcode: TransferOpcode, notify: Optional[TransferNotify] = None,
                            transport_hint: str = "") -> int:
        """Many transfers as one batch, waited for. 0 or -1."""
        if not (len(buffers) == len(peer_buffer_addresses) == len(lengths)):
            _log.error("buffers, peer_buffer_addresses and lengths have different sizes")
            return -1
        seg = self._segment(target_hostname)
        if seg is None:
            return -1
        e = self._engine
        op = libte.WRITE if int(opcode) == Write else libte.READ
        try:
            # The bound is the tasks' deadline: libte ends them by it, so the
            # call returns then and nothing touches the buffers afterwards.
            timeout = self._sync_timeout(sum(lengths))
            if notify is None:
                if op == libte.WRITE:
                    e.write_many(seg, buffers, peer_buffer_addresses, lengths, timeout=timeout)
                else:
                    e.read_many(seg, buffers, peer_buffer_addresses, lengths, timeout=timeout)
                return 0
            with e.batch(max(1, len(buffers))) as b:
                b.submit([(op, seg, loc, rem, n)
                          for loc, rem, n in zip(buffers, peer_buffer_addresses, lengths)],
                         deadline=libte.now_ns() + int(timeout * 1e9))
                b.notify(seg, notify.msg, sender=notify.name)
                if not b.wait(timeout + 0.1):  # a transport that does not honour deadlines
                    b.cancel()
                    raise libte.TimeoutError("transfer not finished within the timeout")
                b.check()
            return 0
        except (libte.Error, TypeError, ValueError, OverflowError) as err:
            _log.error("batch transfer with %s failed: %s", target_hostname, err)
            self._forget(target_hostname, err)
            return -1

    batch_transfer_sync_write = _with_opcode("batch_transfer_sync", Write)
    batch_transfer_sync_read = _with_opcode("batch_transfer_sync", Read)

    def batch_transfer_async(self, target_hostname: str, buffers: Sequence[int],
                             peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                             opcode: TransferOpcode, transport_hint: str = "") -> int:
        """Starts the transfers and returns a batch id for get_batch_transfer_status(),
        or 0 on any failure: Mooncake's sentinel (its batch ids are never 0), also
        when the segment cannot be opened."""
        seg = self._segment(target_hostname)
        if seg is None:
            return 0
        if not (len(buffers) == len(peer_buffer_addresses) == len(lengths)):
            _log.error("buffers, peer_buffer_addresses and lengths have different sizes")
            return 0
        return self._submit_async(seg, target_hostname, buffers, peer_buffer_addresses, lengths,
                                  libte.WRITE if int(opcode) == Write else libte.READ, 0)

    def _submit_async(self, seg, target, buffers, peers, lengths, op, fail_value) -> int:
        try:
            b = self._engine.batch(max(1, len(buffers)))
        except libte.Error as err:
            _log.error("cannot allocate a batch: %s", err)
            return fail_value
        try:
            if op == libte.WRITE:
                invalid = b.submit_write(seg, buffers, peers, lengths, deadline=self._task_deadline())
            else:
                invalid = b.submit_read(seg, buffers, peers, lengths, deadline=self._task_deadline())
        except (libte.Error, TypeError, ValueError, OverflowError) as err:
            _log.error("submit to %s failed: %s", target, err)
            b.free()
            return fail_value
        if invalid:
            b.wait()
            try:
                b.check()
            except libte.Error as err:
                _log.error("submit to %s: %d request(s) refused: %s", target, invalid, err)
            b.free()
            return fail_value
        with self._lock:
            self._batches[b.id] = (b, time.monotonic() + self._deadline(sum(lengths)))
        return b.id

    batch_transfer_async_write = _with_opcode("batch_transfer_async", Write)
    batch_transfer_async_read = _with_opcode("batch_transfer_async", Read)

    def _take(self, batch_id: int):
        with self._lock:
            return self._batches.pop(batch_id, (None, 0))

    def _settle(self, b: libte.Batch):
        """Stops a batch that failed or timed out and frees it once settled."""
        b.cancel()
        b.wait()
        b.free()

    def get_batch_transfer_status(self, batch_ids: Sequence[int]) -> int:
        """Waits for async batches; frees them. 0 when all completed, -1 when one failed,
        timed out or is unknown (the rest are then canceled and freed)."""
        entries = []
        for bid in batch_ids:
            b, deadline = self._take(bid)
            if b is None:
                _log.error("get_batch_transfer_status(): unknown batch id %r", bid)
                for other, _ in entries:
                    self._settle(other)
                return -1
            entries.append((b, deadline))
        failed = False
        for i, (b, deadline) in enumerate(entries):
            if failed:
                self._settle(b)
                continue
            if not b.wait(max(0.0, deadline - time.monotonic())):
                _log.info("batch %d not finished within the timeout", b.id)
                failed = True
            elif b.state != libte.TaskState.COMPLETED:
                try:
                    b.check()
                except libte.Error as err:
                    _log.error("batch %d failed: %s", b.id, err)
                failed = True
            if failed:
                self._settle(b)
            else:
                b.free()
        return -1 if failed else 0

    def transfer_submit_write(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                              length: int, transport_hint: str = "") -> int:
        """Starts one write; returns its batch id for transfer_check_status(), or 0
        (Mooncake's sentinel) when the segment cannot be opened or the write not started."""
        seg = self._segment(target_hostname)
        if seg is None:
            return 0
        return self._submit_async(seg, target_hostname, [buffer], [peer_buffer_address], [length],
                                  libte.WRITE, 0)

    def transfer_check_status(self, batch_id: int) -> int:
        """1 completed, 0 still moving, -1 failed, -2 timed out (1, -1, and -2 for a
        write ended at its MC_SLICE_TIMEOUT deadline, free the batch)."""
        with self._lock:
            b, deadline = self._batches.get(batch_id, (None, 0))
        if b is None:
            _log.error("transfer_check_status(): unknown batch id %r", batch_id)
            return -1
        st = b.info(0)
        if st.state == libte.TaskState.COMPLETED:
            self._take(batch_id)
            b.free()
            return 1
        if st.state in (libte.TaskState.FAILED, libte.TaskState.CANCELED, libte.TaskState.INVALID):
            self._take(batch_id)
            b.wait()
            b.free()
            # libte ended it at its deadline: Mooncake's slice timeout
            return -2 if st.ended_early and st.error == -errno.ETIMEDOUT else -1
        if st.state == libte.TaskState.TIMEOUT or time.monotonic() > deadline:
            return -2
        if st.deadline_ns and libte.now_ns() > st.deadline_ns:
            return -2  # past MC_SLICE_TIMEOUT on a transport that does not end it: it goes on
        return 0

    # -------------------------------------------------------- notifications

    def get_notifies(self) -> List[TransferNotify]:
        """The notifications received since the last call."""
        e = self._eng("get_notifies")
        if e is None:
            return []
        try:
            return [TransferNotify(n.name, n.msg) for n in e.notifications()]
        except libte.Error as err:
            _log.error("get_notifies(): %s", err)
            return []

    # ------------------------------------------------- GPU-stream transfers
    #
    # As in Mooncake, these return at once: the transfers start once the work
    # queued on the stream before the call has finished, and the stream's later
    # work waits until they have ended (libte's te_submit_on_stream: a host
    # function on the stream). 0 once queued; a transfer that fails later is
    # logged, as the call has returned by then. Their batches are freed once
    # ended, at later calls and at close().

    def _on_stream(self, what: str, target_hostname: str, buffers: Sequence[int],
                   peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                   opcode: TransferOpcode, stream_ptr: int) -> int:
        if not (len(buffers) == len(peer_buffer_addresses) == len(lengths)):
            _log.error("%s(): buffers, peer_buffer_addresses and lengths have different sizes", what)
            return -1
        self._reap_streamed()
        seg = self._segment(target_hostname)
        if seg is None:
            return -1
        # The stream belongs to the runtime of the device whose memory is
        # moved; a host buffer (pinned memory) means CUDA's.
        loc = None
        for buf in buffers:
            loc = libte.device_locate(buf)
            if loc is not None:
                break
        op = libte.WRITE if int(opcode) == Write else libte.READ
        try:
            b = self._engine.batch(max(1, len(buffers)))
        except libte.Error as err:
            _log.error("%s(): cannot allocate a batch: %s", what, err)
            return -1
        try:
            b.submit_on_stream([(op, seg, loc_, rem, n)
                                for loc_, rem, n in zip(buffers, peer_buffer_addresses, lengths)],
                               loc.split(":")[0] if loc else "cuda", stream_ptr)
        except (libte.Error, TypeError, ValueError, OverflowError) as err:
            _log.error("%s(): %s", what, err)
            b.wait()  # what was appended has ended (a runtime that refused)
            b.free()
            return -1
        with self._lock:
            self._streamed.append((b, what, target_hostname))
        return 0

    def _reap_streamed(self):
        """Frees the stream-ordered batches that have ended, logging failures."""
        with self._lock:
            batches, self._streamed = self._streamed, []
        left = []
        for b, what, target in batches:
            if not b.wait(0):
                left.append((b, what, target))
                continue
            try:
                b.check()
            except libte.Error as err:
                _log.error("%s() with %s failed once its stream got there: %s", what, target, err)
            b.free()
        with self._lock:
            self._streamed = left + self._streamed

    def transfer_write_on_cuda(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                               length: int, stream_ptr: int = 0,
                               transport_hint: str = "") -> int:
        """Writes once the work queued on the CUDA stream is done; returns at once. 0 or -1."""
        return self._on_stream("transfer_write_on_cuda", target_hostname, [buffer],
                               [peer_buffer_address], [length], Write, stream_ptr)

    def transfer_read_on_cuda(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                              length: int, stream_ptr: int = 0,
                              transport_hint: str = "") -> int:
        """Reads once the work queued on the CUDA stream is done; returns at once. 0 or -1."""
        return self._on_stream("transfer_read_on_cuda", target_hostname, [buffer],
                               [peer_buffer_address], [length], Read, stream_ptr)

    def batch_transfer_write_on_cuda(self, target_hostname: str, buffers: Sequence[int],
                                     peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                                     stream_ptr: int = 0, transport_hint: str = "") -> int:
        return self._on_stream("batch_transfer_write_on_cuda", target_hostname, buffers,
                               peer_buffer_addresses, lengths, Write, stream_ptr)

    def batch_transfer_read_on_cuda(self, target_hostname: str, buffers: Sequence[int],
                                    peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
                                    stream_ptr: int = 0, transport_hint: str = "") -> int:
        return self._on_stream("batch_transfer_read_on_cuda", target_hostname, buffers,
                               peer_buffer_addresses, lengths, Read, stream_ptr)
