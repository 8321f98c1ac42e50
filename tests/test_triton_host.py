"""The Triton launch path's cheap host helpers (triton_src/common.py) give the answers of what
they replace: interpreting() follows TRITON_INTERPRET as os.environ changes at run time (the
smoke check sets it), next_pow2 equals triton.next_power_of_2."""

from __future__ import annotations

import os

import triton

from triton_src import common


def test_interpreting_follows_the_environment(monkeypatch):
    for value, expected in (("1", True), ("0", False), ("", False), ("yes", True)):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert common.interpreting() is expected, value
        assert (os.environ.get("TRITON_INTERPRET") not in ("", "0")) is expected
    monkeypatch.delenv("TRITON_INTERPRET")
    assert common.interpreting() is False
    os.environ["TRITON_INTERPRET"] = "1"  # a plain assignment, as dualk/smoke.py does
    try:
        assert common.interpreting() is True
    finally:
        del os.environ["TRITON_INTERPRET"]
    assert common.interpreting() is False


def test_next_pow2_is_tritons():
    for n in [*range(1, 4100), 2**20 - 1, 2**20, 2**20 + 1, 2**40 + 3]:
        assert common.next_pow2(n) == triton.next_power_of_2(n), n
