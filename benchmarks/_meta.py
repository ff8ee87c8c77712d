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


def metadata(*libs):
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "host": cpu_info(),
            "versions": versions("numpy", "fuseflow", *libs)}


def write_json(path, payload):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
