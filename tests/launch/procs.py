"""Whether the processes a test started are still there (shared by the launch tests)."""

from pathlib import Path


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie is not always reaped in containers)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
