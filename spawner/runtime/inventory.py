"""GPU inventory of a node: from NVML where a driver exists, else declared in config.

NVML answers for the machine it runs on, so ``gpus: "nvml"`` is for the engine
on the Hub's own machine; remote nodes declare their GPUs (with their real
UUIDs, or virtual ones for demos). Virtual GPUs are marked ``virtual`` all
the way into the container's environment, never passed off as real.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

from scheduler_core.model import Gpu, MigInstance, virtual_gpus

__all__ = ["InventoryError", "nvml_gpus", "virtual_gpus"]

_MIG_NAME = re.compile(r"(\d+g\.\d+gb)")


class InventoryError(RuntimeError):
    pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _mig_profile(nvml: ModuleType, handle: Any) -> str:
    """``1g.18gb`` from the MIG device's name, else from its attributes."""
    match = _MIG_NAME.search(_text(nvml.nvmlDeviceGetName(handle)))
    if match:
        return match.group(1)
    attributes = nvml.nvmlDeviceGetAttributes(handle)
    gib = round(attributes.memorySizeMB / 1024)
    return f"{attributes.gpuInstanceSliceCount}g.{gib}gb"


def nvml_gpus(nvml: ModuleType | None = None) -> tuple[Gpu, ...]:
    """Every GPU NVML sees here, with its MIG instances when MIG mode is on.

    ``nvml`` is the pynvml module (tests hand in a stand-in with the same
    functions, since no GPU exists on the machines that run them).
    """
    if nvml is None:
        import pynvml

        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as error:  # pynvml raises NVMLError subclasses per cause
        raise InventoryError(f"NVML is not available here: {error}") from error
    try:
        gpus: list[Gpu] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            name = _text(nvml.nvmlDeviceGetName(handle))
            memory_mib = int(nvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20)
            instances: list[MigInstance] = []
            try:
                current, _pending = nvml.nvmlDeviceGetMigMode(handle)
            except Exception:  # GPUs without MIG support raise NotSupported
                current = 0
            if current:
                for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
                    try:
                        mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                    except Exception:  # an empty slot raises NotFound
                        continue
                    instances.append(
                        MigInstance(_text(nvml.nvmlDeviceGetUUID(mig)), _mig_profile(nvml, mig))
                    )
            gpus.append(Gpu(uuid, index, name, memory_mib, tuple(instances), virtual=False))
        return tuple(gpus)
    finally:
        nvml.nvmlShutdown()
