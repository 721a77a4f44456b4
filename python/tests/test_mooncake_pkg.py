# SPDX-License-Identifier: Apache-2.0
"""The optional `mooncake` package (python/mooncake): mooncake.engine is
libte.mooncake, every other mooncake.* import is refused naming libte, and a
connector written against Mooncake's module moves KV blocks between two
processes through it (sglang_style.py). Skipped where the package is not on
the path (the wheel) unless TE_TEST_MOONCAKE_PKG=1 (the build, which has it)."""
import importlib
import json
import os
import subprocess
import sys

import pytest

import libte.mooncake

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import mooncake
except ModuleNotFoundError:
    if os.environ.get("TE_TEST_MOONCAKE_PKG") == "1":
        raise
    pytest.skip("the mooncake package is not on the path", allow_module_level=True)


def test_engine_is_libte_mooncake():
    import mooncake.engine

    assert mooncake.PROVIDER == "libte"
    assert mooncake.engine.TransferEngine is libte.mooncake.TransferEngine
    for name in libte.mooncake.__all__:
        assert getattr(mooncake.engine, name) is getattr(libte.mooncake, name), name
    assert sorted(mooncake.engine.__all__) == sorted(libte.mooncake.__all__)
    # From the same folder as libte: installed side by side.
    assert os.path.dirname(os.path.dirname(os.path.realpath(mooncake.__file__))) == \
        os.path.dirname(os.path.dirname(os.path.realpath(libte.mooncake.__file__)))


@pytest.mark.parametrize("stmt", [
    "import mooncake.store",
    "from mooncake.store import MooncakeDistributedStore",
    "import mooncake.ep",
    "from mooncake import pg",
    "from mooncake import BufferPool",
    "import mooncake.mooncake_connector_v1",
    "import mooncake.anything_else",
])
def test_other_modules_refused(stmt):
    with pytest.raises(ModuleNotFoundError) as e:
        exec(stmt, {})
    msg = str(e.value)
    assert "libte" in msg and "only 'mooncake.engine'" in msg, msg
    assert e.value.name.startswith("mooncake.")


def test_refusal_survives_reimport():
    # A package imported again (dropped from sys.modules) still refuses,
    # with one finder, not one per import.
    for k in [k for k in sys.modules if k == "mooncake" or k.startswith("mooncake.")]:
        del sys.modules[k]
    again = importlib.import_module("mooncake")
    with pytest.raises(ModuleNotFoundError, match="libte"):
        importlib.import_module("mooncake.store")
    assert sum(getattr(f, "_mooncake_libte", False) for f in sys.meta_path) == 1
    assert importlib.import_module("mooncake.engine").TransferEngine is libte.mooncake.TransferEngine
    assert not hasattr(again, "no_such_name")


def test_other_mooncake_left_alone(tmp_path):
    # With this package dropped and another `mooncake` imported in its place,
    # the other's submodules import as usual.
    other = tmp_path / "mooncake"
    other.mkdir()
    (other / "__init__.py").write_text("")
    (other / "store.py").write_text("WHO = 'other'\n")
    saved = {k: v for k, v in sys.modules.items() if k == "mooncake" or k.startswith("mooncake.")}
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, str(tmp_path))
    try:
        assert importlib.import_module("mooncake.store").WHO == "other"
    finally:
        sys.path.remove(str(tmp_path))
        for k in [k for k in sys.modules if k == "mooncake" or k.startswith("mooncake.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    with pytest.raises(ModuleNotFoundError, match="libte"):
        importlib.import_module("mooncake.store")


def test_sglang_style_two_processes():
    out = subprocess.run([sys.executable, os.path.join(HERE, "sglang_style.py")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sglang-style ok" in out.stdout


def test_kv_bench_runs():
    # python/bench/kv.py, tiny: it must keep working, and refuse to call
    # libte's module Mooncake's.
    kv = os.path.join(HERE, "..", "bench", "kv.py")
    small = ["--layers", "2", "--tokens", "32,64", "--large-total", str(2 << 20), "--min-iters", "1",
             "--min-seconds", "0", "--json"]
    out = subprocess.run([sys.executable, kv, "--impl", "libte"] + small, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    r = json.loads(out.stdout.splitlines()[-1])
    assert r["impl"] == "libte" and r["block"] == 4096 and r["large_gbs"] > 0
    assert [(x["tokens"], x["descriptors"]) for x in r["rows"]] == [(32, 8), (64, 16)]
    out = subprocess.run([sys.executable, kv, "--impl", "mooncake"] + small, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "is libte's" in out.stderr, out.stdout + out.stderr
