"""Fixtures the GPU test modules share."""

import pytest

import ferrodnn as cudnn


@pytest.fixture(scope="module")
def handle():
    """A handle on the CUDA engine (for the GPU tests: their modules skip without a device)."""
    h = cudnn.create_handle()
    assert "cuda" in h.engines()
    yield h
    cudnn.destroy_handle(h)
