#!/usr/bin/env python3
"""Fails when a layer of the RunLoopKit module reaches up.

The module's folders are layers, lowest first (see ARCHITECTURE.md and
Sources/RunLoopKit/RunLoopKit.docc/Threading.md):

    Linux          the kernel backend (epoll, eventfd, timerfd, futex, fstat)
    Core           the loop: modes, items, the run algorithm
    Conveniences, Concurrency, Compatibility
                   built on Core's API (timers' sugar, delayed perform, executors, Date forms)
    Integration    the main loop and libdispatch's main queue
    Applications   keep-alive threads

A file may name types declared in its own layer or below, never above, and may import only the
modules its layer allows (Core imports neither Foundation nor Dispatch). At the package level, no
module under Sources imports another library's private C shim (CRunLoopKit, CRunLoopMonitor): the
lab has its own (CRunLoopLab). Comments and string
literals are ignored. Usage: .ci/check-layers.py [Sources/RunLoopKit]
"""
import re
import sys
from pathlib import Path

LAYERS = [
    ["Linux"],
    ["Core"],
    ["Conveniences", "Concurrency", "Compatibility"],
    ["Integration"],
    ["Applications"],
]
# Modules a layer may not import (those above the standard library, C shims and the small
# packages every layer may use).
FORBIDDEN_IMPORTS = {
    0: {"Foundation", "FoundationEssentials", "Dispatch", "Logging"},
    1: {"Foundation", "FoundationEssentials", "Dispatch"},
}
DECLARATION = re.compile(
    r"^(?:(?:public|package|internal|fileprivate|private|final|indirect|@\w+(?:\([^)]*\))?)\s+)*"
    r"(?:class|struct|enum|protocol|actor|typealias)\s+([A-Z]\w*)", re.M)
IMPORT = re.compile(r"^\s*(?:@\w+\s+)*import\s+(?:class\s+|struct\s+|enum\s+)?(\w+)", re.M)


def strip(source: str) -> str:
    """The code without comments and string literals (multi-line strings included)."""
    source = re.sub(r'"""[\s\S]*?"""', '""', source)
    source = re.sub(r"/\*[\s\S]*?\*/", "", source)
    source = re.sub(r"//[^\n]*", "", source)
    source = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', source)
    return source


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "Sources/RunLoopKit")
    level_of = {folder: level for level, folders in enumerate(LAYERS) for folder in folders}
    files: dict[Path, int] = {}
    for path in sorted(root.rglob("*.swift")):
        folder = path.relative_to(root).parts[0]
        if folder not in level_of:
            print(f"{path}: error: folder '{folder}' is in no layer (add it to .ci/check-layers.py)")
            return 1
        files[path] = level_of[folder]
    declared: dict[str, int] = {}
    code = {path: strip(path.read_text()) for path in files}
    for path, level in files.items():
        for name in DECLARATION.findall(code[path]):
            declared[name] = min(level, declared.get(name, level))
    failures = 0
    for path, level in files.items():
        text = code[path]
        for module in IMPORT.findall(text):
            if module in FORBIDDEN_IMPORTS.get(level, set()):
                print(f"{path}: error: imports {module}, which layer {LAYERS[level]} must not use")
                failures += 1
        for name, owner in declared.items():
            if owner > level and re.search(rf"\b{name}\b", text):
                print(f"{path}: error: names {name}, declared in a higher layer {LAYERS[owner]}")
                failures += 1
    failures += check_package_level(root.parent)
    if failures:
        print(f"layer check: {failures} violation(s)")
        return 1
    print(f"layer check: {len(files)} files, {len(declared)} types, no layer reaches up")
    return 0


# The library modules' private C shims: only their own module may import them.
PRIVATE_SHIMS = {"CRunLoopKit": "RunLoopKit", "CRunLoopMonitor": "RunLoopMonitor"}


def executable_modules(package: Path) -> set[str]:
    """The module names of the package's executable targets (the lab, the test probes)."""
    names = re.findall(r'\.executableTarget\(\s*name:\s*"([^"]+)"', (package / "Package.swift").read_text())
    return {name.replace("-", "_") for name in names}


def check_package_level(sources: Path) -> int:
    """The package level: the executables under Sources (the lab) use the products' API and their
    own shims, never a library's private C shim; no module, test or not, imports an executable
    (tests launch the probes as processes; what they share with the lab is a library target)."""
    failures = 0
    executables = executable_modules(sources.parent)
    paths = sorted(sources.rglob("*.swift")) + sorted((sources.parent / "Tests").rglob("*.swift"))
    for path in paths:
        module = path.relative_to(sources.parent).parts[1]
        for imported in IMPORT.findall(strip(path.read_text())):
            owner = PRIVATE_SHIMS.get(imported)
            if owner is not None and owner != module and path.is_relative_to(sources):
                print(f"{path}: error: imports {imported}, {owner}'s private C shim")
                failures += 1
            if imported in executables and module.replace("-", "_") != imported:
                print(f"{path}: error: imports {imported}, an executable target (move what it needs to a library target)")
                failures += 1
    return failures


if __name__ == "__main__":
    sys.exit(main())
