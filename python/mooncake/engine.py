# SPDX-License-Identifier: Apache-2.0
"""Mooncake's ``mooncake.engine`` module: libte.mooncake under Mooncake's name.

``TransferEngine`` and the module's other public names are libte.mooncake's
own objects (``mooncake.engine.TransferEngine is libte.mooncake.TransferEngine``);
docs/mooncake-compat.md lists what differs from Mooncake's module.
"""

from libte.mooncake import *  # noqa: F401,F403  (the module's public names)
from libte.mooncake import __all__  # noqa: F401
