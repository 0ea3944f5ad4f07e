"""Library source in tracebacks and ``??``: the runtime ships its packages as bytecode, and
install keeps the sources they were compiled from (``runtime_sources``). Checked against the
native ipykernel in the same test: both run the same failing pandas cell, and every pandas
frame the two share points at the same line of code (the two pandas releases may differ in
line numbers, not in these lines).
"""

from __future__ import annotations

import _imp
import itertools
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Kernel, ok

from wasm_kernel.runtime import runtime_sources

NATIVE = "python3"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
FAILING_LOOKUP = "import pandas as pd\npd.DataFrame({'a': [1]})['b']"
FRAME = re.compile(r"^File (?P<path>\S+\.py):\d+, in (?P<function>[\w.<>]+)\(")
ARROW = re.compile(r"^-+> *\d+ (?P<code>.*)$")


def pandas_frames(traceback: list[str]) -> dict[tuple[str, str], str | None]:
    """Each pandas frame of an error's traceback: (module path, function) -> the code its
    arrow points at, None when the frame shows no source."""
    frames: dict[tuple[str, str], str | None] = {}
    lines = ANSI.sub("", "\n".join(traceback)).splitlines()
    for index, line in enumerate(lines):
        frame = FRAME.match(line)
        if frame is None or "/pandas/" not in frame["path"]:
            continue
        module = "pandas/" + frame["path"].split("/pandas/", 1)[1]
        shown = itertools.takewhile(lambda later: later.strip(), lines[index + 1 :])
        arrows = (ARROW.match(later) for later in shown)
        frames[module, frame["function"]] = next((a["code"].strip() for a in arrows if a), None)
    return frames


@pytest.fixture(scope="module")
def native() -> Iterator[Kernel]:
    started = Kernel(kernel_name=NATIVE)
    yield started
    started.shutdown()


def test_pandas_traceback_shows_the_lines_the_native_kernel_shows(
    kernel: Kernel, native: Kernel
) -> None:
    ours = pandas_frames(kernel.execute(FAILING_LOOKUP).content["traceback"])
    theirs = pandas_frames(native.execute(FAILING_LOOKUP).content["traceback"])
    assert ("pandas/core/frame.py", "DataFrame.__getitem__") in ours, ours
    assert all(code is not None for code in ours.values()), ours
    shared = ours.keys() & theirs.keys()
    assert {("pandas/core/frame.py", "DataFrame.__getitem__")} <= shared, (ours, theirs)
    assert {key: ours[key] for key in shared} == {key: theirs[key] for key in shared}


def test_double_question_mark_shows_a_library_function_source(
    kernel: Kernel, native: Kernel
) -> None:
    """``??`` pages the source, as natively: the same definition line."""

    def page(on: Kernel) -> str:
        run = ok(on.execute("import pandas as pd\npd.DataFrame.head??"))
        pages = [item for item in run.content["payload"] if item["source"] == "page"]
        return ANSI.sub("", pages[0]["data"]["text/plain"])

    definition = "def head(self, n: int = 5)"
    assert definition in page(native)
    assert definition in page(kernel)


# -- building the sources zip, no kernel ---------------------------------------------------------

MAGIC = b"\x99\x0e\r\n"  # a made-up interpreter's magic number: only the key matters here


def pyc_of(source: bytes, hash_based: bool = True) -> bytes:
    key = int.from_bytes(MAGIC, "little")
    flags = (1 if hash_based else 0).to_bytes(4, "little")
    return MAGIC + flags + _imp.source_hash(key, source) + b"code"


@pytest.mark.nokernel
def test_only_the_sources_the_bytecode_was_compiled_from_are_kept(tmp_path: Path) -> None:
    stdlib, wheel, built = tmp_path / "lib.zip", tmp_path / "p.whl", tmp_path / "out.zip"
    same, changed, timestamped = b"x = 1\n", b"x = 2\n", b"y = 1\n"
    with zipfile.ZipFile(stdlib, "w") as archive:
        archive.writestr("pkg/same.pyc", pyc_of(same))
        archive.writestr("pkg/changed.pyc", pyc_of(changed))
        archive.writestr("pkg/timestamped.pyc", pyc_of(timestamped, hash_based=False))
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/same.py", same)
        archive.writestr("pkg/changed.py", b"x = 3  # not what was compiled\n")
        archive.writestr("pkg/timestamped.py", timestamped)
        archive.writestr("pkg/extra.py", b"z = 1\n")  # no bytecode of it in the runtime
    assert runtime_sources.build(stdlib, [wheel], built) == 1
    with zipfile.ZipFile(built) as archive:
        assert archive.namelist() == ["pkg/same.py"]
        assert archive.read("pkg/same.py") == same
