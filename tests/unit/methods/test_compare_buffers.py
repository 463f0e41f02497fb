"""compare's buffers for B's copies (methods/compare/buffers.py): reused, bounded, released
after the last compare (nothing stays held once compares stop)."""

from __future__ import annotations

import time

import pytest
import torch

from inspect_model.methods.compare import buffers


@pytest.fixture
def pool(monkeypatch) -> buffers.Buffers:
    monkeypatch.setattr(buffers, "IDLE_S", 0.2)
    return buffers.Buffers()


def test_a_copy_reuses_a_buffer_given_back(pool) -> None:
    pool.start(1 << 20)
    x = torch.arange(12.0).reshape(3, 4).t()  # not contiguous: the copy is, with x's shape and values
    c = pool.copy(x)
    assert c.shape == x.shape and c.is_contiguous() and torch.equal(c, x)
    ptr = c.data_ptr()
    pool.give_back(c)
    assert pool.kept == 48
    d = pool.copy(x + 1)  # the same element count and dtype: the same memory
    assert d.data_ptr() == ptr and torch.equal(d, x + 1) and pool.kept == 0
    assert pool.copy(torch.ones(5)).data_ptr() != ptr  # another size: a fresh buffer
    pool.idle()


def test_what_is_kept_is_bounded_by_the_cap(pool) -> None:
    pool.start(100)
    for _ in range(3):
        pool.give_back(pool.copy(torch.ones(10)))  # 40 bytes each: held at once below, only 2 fit
    held = [pool.copy(torch.ones(10)) for _ in range(3)]
    for t in held:
        pool.give_back(t)
    assert pool.kept == 80
    pool.idle()


def test_buffers_are_released_after_the_last_compare(pool) -> None:
    pool.start(1 << 20)
    pool.give_back(pool.copy(torch.ones(10)))
    pool.idle()
    pool.start(1 << 20)  # a second compare, still running when the first's timer fires
    time.sleep(0.35)
    assert pool.kept == 40
    pool.idle()
    deadline = time.monotonic() + 5
    while pool.kept and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.kept == 0 and pool.cap == 0
    deadline = time.monotonic() + 5
    while pool.timer is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.timer is None
