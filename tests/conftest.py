"""Test set-up: on a machine without a CUDA GPU the Triton kernels run under Triton's CPU
interpreter (TRITON_INTERPRET must be set before Triton is imported); outputs are poisoned with
NaN so an unwritten element fails."""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["DUALK_POISON"] = "1"

import dualk._alloc  # noqa: E402

dualk._alloc.set_poison(True)

DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture
def device() -> torch.device:
    return DEVICE


@pytest.fixture(autouse=True)
def _clean_dispatch_state(monkeypatch, tmp_path_factory):
    """Each test starts without backend overrides from the environment or earlier tests."""
    for key in list(os.environ):
        if key.startswith("DUALK_BACKEND"):
            monkeypatch.delenv(key)
    # No config file: DUALK_CONFIG unset and the default path under an empty directory.
    monkeypatch.delenv("DUALK_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
    import dualk.config
    import dualk.dispatch

    dualk.config.reload()
    dualk.dispatch.set_default_backend(None)
    yield
    dualk.dispatch.set_default_backend(None)
    dualk.config.invalidate()  # the environment is restored after this fixture ends
