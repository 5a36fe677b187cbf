"""The `l2c bench` results file: its environment row (what every result is recorded with, BENCHMARKING.md), and
JSON rows read whole (a torn last line ignored or repaired, `.xz` read through lzma) and appended one flushed line
at a time."""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import lzma
import math
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Set, TextIO, Tuple

from . import settings as l2c_settings
from .errors import BenchError
from .ir import knob
from .knobs import MAX_DIM
from .tuned_table import LAYOUTS

CPU_NOTE = ("CPU mode: kernels run in the Triton interpreter and torch on the CPU; these figures exercise the "
            "benchmark machinery only and say nothing about GPU performance")


def _version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def driver_version() -> Optional[str]:
    """The NVIDIA driver's version: from the kernel module's /proc file where Linux has one (a read of
    microseconds, asked on a first tuned call), else nvidia-smi's; None where there is none."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", f.readline())
        if found:
            return found.group(1)
    except OSError:
        pass
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip().splitlines()[0] if res.returncode == 0 and res.stdout.strip() else None


def environment(device, protocols: List[str], command: str, settings: Dict[str, object]) -> Dict[str, object]:
    """The header row every results file carries (BENCHMARKING.md: what to record with every result)."""
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency
        triton_version = None
    row: Dict[str, object] = {
        "type": "env", "device": device.kind, "gpu": device.name,
        "driver": driver_version() if device.kind == "cuda" else None,
        "cuda": torch.version.cuda, "torch": torch.__version__, "triton": triton_version,
        "cutlass": _version("nvidia-cutlass"), "python": platform.python_version(),
        "protocols": protocols, "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(), "cwd": os.getcwd(), "settings": settings,
        # the l2c settings in effect (how calls were prepared and served; never a secret)
        "l2c_settings": {name: l2c_settings.value(name) for name in l2c_settings.SETTINGS
                         if l2c_settings.value(name) and not name.endswith("_API_KEY")},
    }
    if device.kind == "cuda":
        props = torch.cuda.get_device_properties(device.torch_device)
        row.update(sm=f"sm_{props.major}{props.minor}", sm_count=props.multi_processor_count,
                   l2_bytes=device.l2_bytes)
    else:
        row["note"] = CPU_NOTE
        row["triton_interpret"] = os.environ.get("TRITON_INTERPRET")
    return row


def row_key(row: Dict[str, object]) -> Tuple:
    """What one row measured: the kernel, the shape, the protocol and the problem's dtype, layouts and gate (one
    candidate id, such as `dispatch:TABLE`, is measured in several dtypes)."""
    return (row["kernel"], row["m"], row["n"], row["k"], row.get("batch", 1), row["protocol"], row.get("dtype"),
            row.get("layout"), row.get("gate", "none"))


MAX_DIMENSION = MAX_DIM
PROTOCOLS = ("kernel", "kernel_apart", "call", "server")


def parse_protocols(text: str) -> List[str]:
    """The protocols a comma-separated list names, each once; ValueError for an unknown one."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in PROTOCOLS]
    if bad or not names:
        raise ValueError(f"unknown protocol(s) {', '.join(bad) or repr(text)}; expected a comma-separated "
                         f"subset of {', '.join(PROTOCOLS)}")
    return list(dict.fromkeys(names))


RESULT_TARGETS = ("triton", "cutlass", "dispatch", "torch")   # a kernel's target, l2c's dispatcher, torch itself
RESULT_TEXT_FIELDS = ("kernel", "protocol", "dtype", "layout", "spec", "source", "status", "target", "gate")


def _positive_finite(value) -> bool:
    """A number above 0 that a float holds (a JSON integer past 1e308 does not: float() overflows)."""
    try:
        return 0 < float(value) < math.inf
    except OverflowError:
        return False


def checked_row(row, where: str) -> Dict[str, object]:
    """`row` if it is one every reader of results can take; BenchError naming the line and field otherwise: a JSON
    object; a result row with its shape, M, N, K and batch whole numbers from 1 to 2^31 - 1, a known protocol where
    named, text fields text, and a speedup and flops that are numbers (in an `ok` row finite and positive, the speedup
    present)."""
    if not isinstance(row, dict):
        raise BenchError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
    if row.get("type") == "env":
        if row.get("gpu") is not None and not isinstance(row["gpu"], str):
            raise BenchError(f"{where}: 'gpu' must be text, got {row['gpu']!r}"[:300])
        if row.get("sm_count") is not None and (type(row["sm_count"]) is not int or row["sm_count"] < 1):
            raise BenchError(f"{where}: 'sm_count' must be a whole number, got {row['sm_count']!r}"[:300])
    if row.get("type") != "result":
        return row
    for field in ("m", "n", "k"):   # (a script's own rows may name no kernel or protocol)
        if field not in row:
            raise BenchError(f"{where}: a result row without '{field}'")
    for field in ("m", "n", "k", "batch"):
        value = row.get(field, 1)
        if type(value) is not int or not 1 <= value <= MAX_DIMENSION:
            raise BenchError(f"{where}: '{field}' must be a whole number from 1 to {MAX_DIMENSION}, got {value!r}")
    for field in RESULT_TEXT_FIELDS:
        if row.get(field) is not None and not isinstance(row[field], str):
            raise BenchError(f"{where}: '{field}' must be text, got {row[field]!r}"[:300])
    if row.get("protocol", PROTOCOLS[0]) not in PROTOCOLS:
        raise BenchError(f"{where}: 'protocol' must be one of {', '.join(PROTOCOLS)}, got {row['protocol']!r}"[:300])
    if row.get("target") not in (None, *RESULT_TARGETS):
        raise BenchError(f"{where}: 'target' must be one of {', '.join(RESULT_TARGETS)}, got {row['target']!r}"[:300])
    if row.get("served_target") not in (None, "triton", "cutlass"):
        raise BenchError(f"{where}: 'served_target' must be triton or cutlass, got {row['served_target']!r}"[:300])
    if row.get("gate") not in (None, *knob("epilogue_gate").choices):
        raise BenchError(f"{where}: 'gate' must be one of {', '.join(knob('epilogue_gate').choices)}, got "
                         f"{row['gate']!r}"[:300])
    if "dtype" in row and row["dtype"] not in knob("types_a").choices:
        raise BenchError(f"{where}: 'dtype' must be one of {', '.join(knob('types_a').choices)}, got {row['dtype']!r}")
    if "layout" in row and (not isinstance(row["layout"], str) or row["layout"] not in LAYOUTS):
        raise BenchError(f"{where}: 'layout' must be three of row/col joined by commas, got {row['layout']!r}")
    ok = row.get("status") == "ok"
    for field in ("speedup", "flops"):
        value = row.get(field)
        required = ok and (field == "speedup" or field in row)   # an ok row's speedup, and its flops if named
        if (value is not None or required) and (
                type(value) not in (int, float) or (ok and not _positive_finite(value))):
            raise BenchError(f"{where}: '{field}' must be a number (finite and positive in an ok row), got "
                             f"{value!r}"[:300])
    return row


def read_rows(path: str | Path, repair: bool = False) -> List[Dict[str, object]]:
    """All complete JSON rows of a results file, each checked (`checked_row`). A torn last line (a run killed
    mid-write) is ignored, and with `repair` cut off so that appending continues on a clean line. A bad line elsewhere
    is an error. A `.xz` file (a large finished results file, compressed to keep the repository small) is read
    through lzma."""
    path = Path(path)
    if path.suffix == ".xz":
        if repair:
            raise BenchError(f"{path} is compressed: results are appended to a plain .jsonl (decompress it first)")
        try:
            data = lzma.decompress(path.read_bytes())
        except lzma.LZMAError as err:
            raise BenchError(f"{path}: not an xz file ({err})") from None
    else:
        data = path.read_bytes()
    rows, good_end, pos = [], 0, 0
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        end = pos + len(line) + 1
        if line.strip():
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                if i < len(lines) - 1 and any(x.strip() for x in lines[i + 1:]):
                    raise BenchError(f"{path}:{i + 1}: not a JSON row") from None
                break
            rows.append(checked_row(row, f"{path}:{i + 1}"))
            good_end = min(end, len(data))
        else:
            good_end = min(end, len(data))
        pos = end
    if repair and good_end < len(data):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    if repair and good_end > 0 and not data[:good_end].endswith(b"\n"):
        with open(path, "ab") as f:
            f.write(b"\n")
    return rows


class ResultsWriter:
    """Appends JSON rows, each written whole and flushed at once. A resumed file must have been measured as this run
    measures (`measured_as`: the device, the GPU and the settings that change what a row means, each compared with
    every environment row of the file): its rows are one population."""

    def __init__(self, path: Path, resume: bool, measured_as: Optional[Dict[str, object]] = None):
        self.path = path
        self.done: Set[Tuple] = set()
        if path.suffix == ".xz":
            raise BenchError(f"{path}: results are written to a plain .jsonl (compress it with xz when it is done)")
        if path.exists() and path.stat().st_size > 0:
            if not resume:
                raise BenchError(f"{path} already exists: pass --resume to continue it, or choose another -o")
            rows = read_rows(path, repair=True)
            envs = [r for r in rows if r.get("type") == "env"]
            for env in envs if measured_as else ():
                _same_measurement(path, env, measured_as)
            self.done = {row_key(r) for r in rows if r.get("type") == "result"}
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f: TextIO = open(path, "a")

    def write(self, row: Dict[str, object]) -> None:
        self.f.write(json.dumps(row, allow_nan=True) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def _same_measurement(path: Path, env: Dict[str, object], measured_as: Dict[str, object]) -> None:
    """BenchError naming what differs between one environment row of a file and this run."""
    recorded = dict(env.get("settings") or {}, device=env.get("device"), gpu=env.get("gpu"))
    differ = [f"{name} {recorded.get(name)!r} there, {value!r} now" for name, value in measured_as.items()
              if name in recorded and recorded[name] != value]
    if differ:
        raise BenchError(f"{path} was measured otherwise ({'; '.join(differ)}): --resume continues a file only "
                         f"with the same machine and method; write another -o")


def command_line(argv: Optional[List[str]] = None) -> str:
    argv = list(sys.argv if argv is None else argv)
    if argv and os.path.basename(argv[0]) in ("l2c", "__main__.py", "cli.py"):
        argv[0] = "l2c"
    return shlex.join(argv)
