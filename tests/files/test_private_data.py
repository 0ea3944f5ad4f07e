"""What a kernel keeps for its user (history, snapshots) is theirs alone: real local users in
homes every user may enter (Debian's 0755), one user's kernel started through jupyter_client
under the most permissive umask, the other user trying to read what it left.
"""

from __future__ import annotations

import stat
from collections.abc import Iterator

import pytest
from local_users import LocalUser, local_users, run_cells

KERNEL = "wasm-python"
SECRET = "4111 1111 1111 1111"


@pytest.fixture(scope="module")
def users() -> Iterator[list[LocalUser]]:
    with local_users(2) as made:
        yield made


def test_one_users_history_and_snapshots_are_closed_to_another(users: list[LocalUser]) -> None:
    """History and snapshots are made private under umask 000, and a snapshots folder an
    older version left open (0755) is narrowed on first use: the other user can read
    neither the history's cells nor the snapshots' names or contents."""
    owner, other = users
    data = owner.home / ".local" / "share" / "wasm-kernel"
    made = owner.run(["mkdir", "-p", "-m", "0755", str(data / "snapshots")])
    assert made.returncode == 0, made.stderr
    ran = run_cells(
        owner,
        KERNEL,
        [f"card = {SECRET!r}", "%snapshot save with-card", "len(card)"],
        umask=0o000,
    )
    assert [status for status, _ in ran] == ["ok", "ok", "ok"], ran
    history = data / "history.sqlite"
    snapshots = data / "snapshots"
    assert SECRET.encode() in history.read_bytes() + b"".join(
        path.read_bytes() for path in data.glob("history.sqlite-*")
    )  # the cell is there (as root), so the other user's failure below means something
    assert [p.name for p in snapshots.iterdir() if not p.name.startswith(".")]

    tried = other.python(
        f"""
        import os
        from pathlib import Path
        data = Path({str(data)!r})
        attempts = {{
            "read the history": lambda: Path({str(history)!r}).read_bytes(),
            "list the snapshots": lambda: os.listdir(data / "snapshots"),
            "list the data folder": lambda: os.listdir(data),
        }}
        for what, attempt in attempts.items():
            try:
                attempt()
            except PermissionError:
                continue
            print(what)
        """
    )
    assert tried.returncode == 0, tried.stderr
    assert tried.stdout == "", f"the other user could: {tried.stdout}"
    image = next(p for p in snapshots.iterdir() if not p.name.startswith("."))
    read_image = other.python(f"open({str(image)!r}, 'rb').read(1)")
    assert "PermissionError" in read_image.stderr, read_image.stderr

    for path, mode in [(data, 0o700), (snapshots, 0o700), (history, 0o600)]:
        assert stat.S_IMODE(path.stat().st_mode) == mode, f"{path}: {path.stat().st_mode:o}"
    for path in [*snapshots.iterdir(), *data.glob("history.sqlite*")]:
        assert not path.stat().st_mode & 0o077, f"{path}: {path.stat().st_mode:o}"
