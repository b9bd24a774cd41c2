"""Can requirements.txt be installed on macOS (arm64) and Windows? A pip dry run per platform.

`python3 make.py book` installs requirements.txt, the environment pinned on Linux. A pin with no
wheel for another platform (triton has Linux wheels only) makes the install fail there, while the
README promises "only Python and git". For each target (platform tag, Python version) this:

1. evaluates each requirement's environment marker for the TARGET (pip itself would evaluate
   `; sys_platform == "linux"` against the machine it runs on, not the --platform it is given);
2. runs `pip install --dry-run --only-binary=:all: --platform … --python-version … --no-deps`
   over the pins that apply, so each pin must have a wheel for that platform and Python.
   Pins that only exist as pure-Python source archives (PURE_SDISTS) are left to the real
   install. Dependencies that a platform adds through markers (pywin32, colorama, appnope) are
   not pinned; pip resolves them when it installs.

Usage:
    python -m tools.platform_check                       # the default targets
    python -m tools.platform_check macosx_14_0_arm64:3.12
"""

from __future__ import annotations

import argparse
import concurrent.futures
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from tools import ROOT

REQUIREMENTS = ROOT / "requirements.txt"
# Pinned packages published only as source archives of pure Python (no platform wheels needed).
PURE_SDISTS = {"jieba"}
# (pip platform tag, Python version): the oldest and newest Python the pins support, on the two
# platforms readers use besides Linux.
DEFAULT_TARGETS = ("macosx_14_0_arm64:3.13", "macosx_14_0_arm64:3.11.9", "win_amd64:3.12", "win_amd64:3.11.9")
NETWORK_ERRORS = re.compile(r"NewConnectionError|Max retries exceeded|Temporary failure in name resolution|"
                            r"Network is unreachable|ConnectTimeout|ReadTimeout")


@dataclass(frozen=True)
class Target:
    platform: str
    python: str

    @classmethod
    def parse(cls, text: str) -> Target:
        platform, _, python = text.partition(":")
        if not platform or not re.fullmatch(r"3\.\d+(\.\d+)?", python):
            raise ValueError(f"target must look like macosx_14_0_arm64:3.12, got {text!r}")
        return cls(platform, python)

    def marker_environment(self) -> dict[str, str]:
        """PEP 508 marker variables of the target (what `; sys_platform == ...` is evaluated with)."""
        parts = self.python.split(".")
        short = ".".join(parts[:2])
        full = self.python if len(parts) == 3 else short + ".0"
        if self.platform.startswith("macosx"):
            system, sys_platform, os_name = "Darwin", "darwin", "posix"
            machine = "arm64" if self.platform.endswith("arm64") else "x86_64"
        elif self.platform.startswith("win"):
            system, sys_platform, os_name = "Windows", "win32", "nt"
            machine = "ARM64" if "arm64" in self.platform else "AMD64"
        else:
            system, sys_platform, os_name = "Linux", "linux", "posix"
            machine = "aarch64" if "aarch64" in self.platform else "x86_64"
        return {
            "implementation_name": "cpython", "implementation_version": full, "os_name": os_name,
            "platform_machine": machine, "platform_python_implementation": "CPython",
            "platform_release": "", "platform_system": system, "platform_version": "",
            "python_full_version": full, "python_version": short, "sys_platform": sys_platform,
        }

    def __str__(self) -> str:
        return f"{self.platform}:{self.python}"


def is_pure_python(name: str) -> bool:
    """True if the installed distribution `name` came from a py3-none-any wheel (so the same file
    installs on every platform); False if it is platform-specific or not installed here."""
    import importlib.metadata

    try:
        wheel = importlib.metadata.distribution(name).read_text("WHEEL") or ""
    except importlib.metadata.PackageNotFoundError:
        return False
    tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
    return bool(tags) and all(t.endswith("-none-any") for t in tags)


def pins_for(target: Target, requirements: Path = REQUIREMENTS, *,
             platform_specific_only: bool = False) -> tuple[list[str], list[str]]:
    """(requirement lines that apply to `target`, names skipped by their marker).

    platform_specific_only: leave out pins installed here from a pure-Python wheel (one file
    for every platform; checking it once, for one target, is enough).
    """
    keep, skipped = [], []
    env = target.marker_environment()
    for raw in requirements.read_text(encoding="utf-8").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            skipped.append(req.name)
            continue
        if req.name.lower() in PURE_SDISTS or (platform_specific_only and is_pure_python(req.name)):
            continue
        keep.append(f"{req.name}{req.specifier}")
    return keep, skipped


@dataclass
class Result:
    target: Target
    ok: bool
    network_error: bool
    skipped: list[str]
    output: str


def check(target: Target, requirements: Path = REQUIREMENTS, pip: list[str] | None = None, *,
          platform_specific_only: bool = False) -> Result:
    """Dry-run pip for one target; ok when every applicable pin has a wheel there."""
    keep, skipped = pins_for(target, requirements, platform_specific_only=platform_specific_only)
    pip = pip or [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory() as tmp:
        req_file = Path(tmp) / "requirements.txt"
        req_file.write_text("\n".join(keep) + "\n", encoding="utf-8")
        cmd = [*pip, "install", "--dry-run", "--ignore-installed", "--no-deps", "--only-binary=:all:",
               "--platform", target.platform, "--python-version", target.python, "--implementation", "cp",
               "--target", str(Path(tmp) / "target"), "--disable-pip-version-check", "-r", str(req_file)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    output = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines()
                       if "is ignored: it is neither a file nor a directory" not in line)
    return Result(target, proc.returncode == 0, bool(NETWORK_ERRORS.search(output)), skipped, output)


def check_all(targets=DEFAULT_TARGETS, requirements: Path = REQUIREMENTS) -> list[Result]:
    """Check every target in parallel. On each platform the oldest Python gets every pin; the
    other Pythons only the pins that are platform-specific here (wheels tagged for Linux), which
    is where a newer Python can lack a wheel."""
    parsed = [t if isinstance(t, Target) else Target.parse(t) for t in targets]
    version = lambda t: tuple(int(x) for x in t.python.split("."))  # noqa: E731
    full = {min((t for t in parsed if t.platform == p), key=version) for p in {t.platform for t in parsed}}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(parsed)) as pool:
        return list(pool.map(lambda t: check(t, requirements, platform_specific_only=t not in full), parsed))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Dry-run requirements.txt for other platforms.")
    parser.add_argument("targets", nargs="*", default=list(DEFAULT_TARGETS), help="PLATFORM:PYTHON, e.g. win_amd64:3.12")
    args = parser.parse_args(argv)
    failed = 0
    for result in check_all(args.targets):
        status = "ok" if result.ok else ("network error" if result.network_error else "FAILED")
        note = f" (not installed there by marker: {', '.join(result.skipped)})" if result.skipped else ""
        print(f"{result.target}: {status}{note}")
        if not result.ok:
            failed += 1
            print("\n".join(line for line in result.output.splitlines() if line.startswith("ERROR"))[-3000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
