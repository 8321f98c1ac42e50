"""The Triton launch path's cheap host helpers (triton_src/common.py) give the answers of what
they replace: pow2_bucket (the launch paths' power-of-two rounding) equals
triton.next_power_of_2, which costs ~2.7 us of host time a call (Triton 3.9)."""

from __future__ import annotations

import triton

from triton_src import common


def test_pow2_bucket_is_tritons_next_power_of_2():
    for n in [*range(0, 4100), 2**20 - 1, 2**20, 2**20 + 1, 2**40 + 3]:
        assert common.pow2_bucket(n) == triton.next_power_of_2(n), n
