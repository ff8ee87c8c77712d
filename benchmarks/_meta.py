"""Metadata every benchmark JSON carries: date, host, hardware and library versions."""

from __future__ import annotations

import datetime
import importlib
import json
import os
import platform


def versions(*names):
    out = {}
    for name in names:
        try:
            out[name] = importlib.import_module(name).__version__
        except Exception:
            out[name] = None
    return out


def cpu_info():
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "machine": platform.machine()}


def gpu_info():
    """Name, driver and CUDA versions of GPU 0, or None without CuPy or a GPU."""
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"]
        return {"name": name.decode() if isinstance(name, bytes) else name,
                "sms": props["multiProcessorCount"],
                "driver": cupy.cuda.runtime.driverGetVersion(),
                "runtime": cupy.cuda.runtime.runtimeGetVersion()}
    except Exception:  # noqa: BLE001 - metadata is best effort
        return None


def metadata(*libs):
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "host": cpu_info(), "gpu": gpu_info(),
            "versions": versions("numpy", "fuseflow", *libs),
            # the settings a run was made under (FUSEFLOW_OVERLAP_WGRAD=0, ...)
            "settings": {k: v for k, v in sorted(os.environ.items())
                         if k.startswith("FUSEFLOW_")}}


def write_json(path, payload):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
