# SPDX-License-Identifier: Apache-2.0
"""``mooncake.engine`` on libte: Mooncake's Python transfer engine module,
provided by libte.mooncake, so code written for Mooncake's package
(``from mooncake.engine import TransferEngine``) runs on libte unmodified.

This package provides ``mooncake.engine`` and nothing else. Importing any other
``mooncake.*`` module (``mooncake.store``, ``mooncake.ep``, ...) raises
ModuleNotFoundError saying so, instead of finding half of another package.
"""

import importlib.abc as _abc
import sys as _sys

PROVIDED = ("engine",)
"""The submodules this package has: Mooncake's names that libte honours."""

PROVIDER = "libte"


class _Refuse(_abc.MetaPathFinder):
    """Answers every import of ``mooncake.X`` for an X not in PROVIDED with
    an error naming libte, ahead of the path finders."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(__name__ + "."):
            return None
        # Only while the `mooncake` imported is this one: a process that
        # drops it and imports another package of that name is left alone.
        if getattr(_sys.modules.get(__name__), "PROVIDER", None) != PROVIDER:
            return None
        sub = fullname[len(__name__) + 1:]
        if sub.split(".", 1)[0] in PROVIDED:
            return None
        raise ModuleNotFoundError(
            f"No module named {fullname!r}: this 'mooncake' package is libte's "
            f"(libte.mooncake) and provides only 'mooncake.engine'; Mooncake's "
            f"{sub!r} module is not part of it", name=fullname)


# One finder per interpreter, also when the package is imported again after
# being dropped from sys.modules.
if not any(getattr(f, "_mooncake_libte", False) for f in _sys.meta_path):
    _finder = _Refuse()
    _finder._mooncake_libte = True
    _sys.meta_path.insert(0, _finder)

# What Mooncake's own package offers at its top level beyond `engine`: its
# native modules and the names its __init__ exports. `from mooncake import
# store` asks for these as attributes; they get the same error as an import.
_MOONCAKE_NAMES = frozenset((
    "store", "ep", "_ep", "pg", "tent", "BufferPool", "RegisteredBufferPool", "buffer_pool",
    "mooncake_config", "mooncake_connector_v1", "mooncake_store_service", "http_metadata_server",
    "transfer_engine_topology_dump", "cli", "cli_bench", "cli_client",
))


def __getattr__(name):
    if name in _MOONCAKE_NAMES:
        raise ModuleNotFoundError(
            f"'mooncake.{name}' is not provided: this 'mooncake' package is libte's "
            f"(libte.mooncake) and provides only 'mooncake.engine'", name=f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PROVIDED", "PROVIDER"]
