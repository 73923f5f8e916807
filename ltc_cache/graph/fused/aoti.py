"""Every use ltc_cache makes of AOTInductor's private surface.

A fused library is compiled by ``torch._inductor.aoti_compile_and_package``
into a package whose layout is AOTInductor's own (one ``*.wrapper.so`` and
its ``*.wrapper_metadata.json``), and loaded through the C++ runner
``torch._C._aoti.AOTIModelContainerRunnerCpu``, which runs it on a list of
tensors without importing Inductor (``torch._inductor.package`` costs over
a second). All of it is torch-private. This module is the one place in the
package that touches ``torch._inductor``, ``torch._C._aoti`` and the ABI
torch was built with (``torch._C._GLIBCXX_USE_CXX11_ABI``)
(``tests/common/test_layers.py`` holds every other module to that), so that
a torch upgrade that moves them breaks here, and
``tests/common/test_torch_private.py`` (its AOTInductor section) is where it
breaks first, by name.

Written against torch 2.13.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ...errors import UnexpectedPackage

__all__ = ["compile_library", "cpu_runner", "cxx11_abi", "runner_available"]


def cxx11_abi() -> bool:
    """Whether this torch was built with the C++11 ABI of libstdc++: a
    library compiled against it links with the same."""
    return bool(torch._C._GLIBCXX_USE_CXX11_ABI)


def runner_available() -> bool:
    """Whether this torch has the C++ runner."""
    return hasattr(torch._C, "_aoti") and hasattr(torch._C._aoti,
                                                   "AOTIModelContainerRunnerCpu")


def cpu_runner(path: str) -> Any:
    """The C++ runner of the shared library at ``path`` (one model
    container: a runner serves one call at a time). Raises RuntimeError
    where it does not load."""
    return torch._C._aoti.AOTIModelContainerRunnerCpu(path, 1)


def compile_library(exported: torch.export.ExportedProgram,
                    settings: Mapping[str, Any]) -> tuple[bytes, str]:
    """The shared library AOTInductor compiles ``exported`` into, with
    Inductor ``settings``, and the vector ISA it compiled it for. Raises
    :class:`UnexpectedPackage` where the package is not one library, and
    whatever the compile raises."""
    import json
    import zipfile

    import torch._inductor

    with tempfile.TemporaryDirectory(prefix="ltc_cache-fuse-") as tmp:
        package = Path(tmp) / "graph.pt2"
        torch._inductor.aoti_compile_and_package(exported, package_path=str(package),
                                                 inductor_configs=dict(settings))
        with zipfile.ZipFile(package) as archive:
            names = archive.namelist()
            libraries = [n for n in names if n.endswith(".so")]
            blobs = [n for n in names if n.endswith((".bin", ".blob", "constants"))]
            if len(libraries) != 1 or not libraries[0].endswith(".wrapper.so") or blobs:
                raise UnexpectedPackage(f"AOTInductor's package holds {libraries + blobs}, "
                                        "not one library")
            library = archive.read(libraries[0])
            meta_name = libraries[0].removesuffix(".so") + "_metadata.json"
            meta = json.loads(archive.read(meta_name)) if meta_name in names else {}
    return library, str(meta.get("AOTI_CPU_ISA", ""))
