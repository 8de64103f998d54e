"""Where CUDA forward compatibility can work.

NVIDIA documents the forward-compat package (an image's /usr/local/cuda/compat) for data
center GPUs, select RTX server SKUs and Jetson only: on a consumer card CUDA refuses it
(cudaErrorCompatNotSupportedOnDevice, 804) for every process of the container, where the
driver's own libcuda would have worked (minor version compatibility). So the compat
libraries are put first only when none of the container's GPUs is a consumer card.
Brands not known to be consumer ones (Quadro, NvidiaRTX, Unknown...) keep NVIDIA's
behaviour: some RTX professional SKUs are supported.
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable

    from libinject.discover.model import Gpu

# NVML brand names (libinject.discover.nvml.BRANDS), compared case-insensitively
CONSUMER_BRANDS = frozenset({"geforce", "geforcertx", "titan", "titanrtx"})


def consumer(gpus: Iterable[Gpu]) -> list[Gpu]:
    """The GPUs among `gpus` forward compatibility does not support."""
    return [g for g in gpus if g.brand.lower() in CONSUMER_BRANDS]


def consumer_model(model: str) -> bool:
    """Whether a GPU model name (procfs's "Model:", where NVML is not at hand) is a
    consumer card's: NVIDIA names them "NVIDIA GeForce ..." and "NVIDIA TITAN ..."."""
    words = model.lower().split()
    return "geforce" in words or "titan" in words
