"""What several of CI's Python scripts share: Chromium (installed if missing) and the release version."""
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(tool, message):
    print(f"{tool}: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def ensure_chromium(tool):
    """Chromium's path; installs Debian's `chromium` with apt-get if it is missing, and exits 1 (the
    check is never skipped) if that fails."""
    path = find_chromium()
    if path:
        return path
    print(f"{tool}: Chromium is not installed; installing Debian's chromium with apt-get", flush=True)
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (prefix + ["apt-get", "update", "-qq"], prefix + ["apt-get", "install", "-y", "-qq", "chromium"]):
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            fail(tool,
                 "Chromium is not installed and `" + " ".join(command) + f"` failed (exit {result.returncode}):\n"
                 + (result.stderr or result.stdout)[-2000:]
                 + "\nInstall Chromium (Debian: apt-get install chromium) and run this again; the check is not skipped.")
    path = find_chromium()
    if not path:
        fail(tool, "apt-get installed chromium but no chromium binary is on PATH")
    return path


def release_version(tool):
    """The newest released version in CHANGELOG.md (its first '## X.Y.Z' heading)."""
    with open(os.path.join(ROOT, "CHANGELOG.md")) as handle:
        for line in handle:
            match = re.match(r"^## \[?(\d+\.\d+\.\d+)\]?", line)
            if match:
                return match.group(1)
    fail(tool, "CHANGELOG.md names no version ('## X.Y.Z')")
