"""What ``nvc-py info`` prints: text (the reference layout), CSV and JSON.

Text labels are padded to 15 columns as in the reference tool; MIG devices, which it
does not describe, follow their GPU indented by two spaces with 20-column labels, so a
reader of the reference layout can skip them. JSON keeps every key present (null when
unknown) so that its schema does not depend on the machine.
"""

from __future__ import annotations

import csv
import io
import json

from nvc.discover.inventory import Inventory
from nvc.discover.procfs import normalize_bus_id
from nvc.model.devices import Gpu, MigDevice

INFO_SCHEMA_VERSION = 1


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version number as ``major.minor`` (12040 → ``12.4``)."""
    return f"{version // 1000}.{(version % 100) // 10}"


def bus_location(bus_id: str) -> str:
    """The ``%08x:%02x:%02x.0`` form of a bus id."""
    normalised = normalize_bus_id(bus_id)
    return (normalised or bus_id).lower()


GPU_LABELS = ("Device Index", "Device Minor", "Model", "Brand", "GPU UUID", "Bus Location", "Architecture")
MIG_LABELS = ("MIG Device Index", "GPU Instance ID", "Compute Instance ID", "MIG UUID")


def _gpu_values(gpu: Gpu) -> tuple[str, ...]:
    return (str(gpu.index), str(gpu.minor), gpu.model, gpu.brand, gpu.uuid, bus_location(gpu.bus_id), gpu.architecture)


def _mig_values(mig: MigDevice) -> tuple[str, ...]:
    return (str(mig.index), str(mig.gpu_instance_id), str(mig.compute_instance_id), mig.uuid)


def text(inv: Inventory, cuda_version: int) -> str:
    lines = [f"{'NVRM version:':<15} {inv.driver_version}", f"{'CUDA version:':<15} {cuda_version_text(cuda_version)}"]
    for gpu in inv.gpus:
        lines.append("")
        lines += [f"{label + ':':<15} {value}" for label, value in zip(GPU_LABELS, _gpu_values(gpu), strict=True)]
        for mig in gpu.mig_devices:
            lines.append("")
            lines += [f"  {label + ':':<20} {value}" for label, value in zip(MIG_LABELS, _mig_values(mig), strict=True)]
    return "\n".join(lines) + "\n"


def csv_text(inv: Inventory, cuda_version: int) -> str:
    """Driver line, GPU table and, when there are MIG devices, a MIG table; blank lines between."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows([("NVRM version", "CUDA version"), (inv.driver_version, cuda_version_text(cuda_version)), ()])
    writer.writerow(GPU_LABELS)
    writer.writerows(_gpu_values(gpu) for gpu in inv.gpus)
    migs = [(gpu, mig) for gpu in inv.gpus for mig in gpu.mig_devices]
    if migs:
        writer.writerows([(), ("Device Index", *MIG_LABELS)])
        writer.writerows((str(gpu.index), *_mig_values(mig)) for gpu, mig in migs)
    return out.getvalue()


def json_text(inv: Inventory, cuda_version: int) -> str:
    doc = {
        "schema_version": INFO_SCHEMA_VERSION,
        "nvrm_version": inv.driver_version,
        "cuda_version": cuda_version_text(cuda_version),
        "devices": [
            {
                "index": gpu.index,
                "minor": gpu.minor,
                "model": gpu.model,
                "brand": gpu.brand,
                "uuid": gpu.uuid,
                "bus_id": bus_location(gpu.bus_id),
                "architecture": gpu.architecture,
                "memory_total": gpu.memory_total,
                "mig_enabled": gpu.mig_enabled,
                "mig_devices": [
                    {
                        "index": mig.index,
                        "gpu_instance_id": mig.gpu_instance_id,
                        "compute_instance_id": mig.compute_instance_id,
                        "uuid": mig.uuid,
                        "memory_total": mig.memory_total,
                    }
                    for mig in gpu.mig_devices
                ],
            }
            for gpu in inv.gpus
        ],
    }
    return json.dumps(doc, indent=2) + "\n"
