"""Tracebacks the way IPython shows them: coloured, cell-labelled, with source and an arrow.

Frames of the kernel's own guest code (file names starting ``<wasm-kernel``) are left out,
so users see their cells and the libraries they called, nothing else. Chained exceptions,
notes and exception groups are kept.
"""

import linecache
import re
import sys
import traceback

RED, GREEN, CYAN, BOLD, RESET = "\x1b[31m", "\x1b[32m", "\x1b[36m", "\x1b[1m", "\x1b[0m"
RULE = "-" * 75
CONTEXT = 2  # source lines shown before and after the failing one
KERNEL_FILES = "<wasm-kernel"
CELL_PREFIX = "Cell In["
REFUSED = "[Errno 63] "  # EPERM: what WASI answers for paths outside the grants or read-only
REFUSED_HINT = (
    "(The sandbox refused this path: only its mounted folders are reachable, and only /tmp"
    " and read-write mounts can be changed. %sandbox lists them.)"
)
QUOTA = "[Errno 19] "  # EDQUOT: the private /tmp is over its size limit
QUOTA_HINT = (
    "(The private /tmp is over its size limit, so nothing there can grow: delete files in it"
    " to write again. Files that were open for writing there have become read-only.)"
)
TOO_MANY_FILES = "[Errno 33] "  # EMFILE: the sandbox's cap on open descriptors
TOO_MANY_FILES_HINT = (
    "(The sandbox limits how many files a kernel may hold open at once: close the ones you"
    " no longer need, for example by opening them in a `with` block.)"
)

NO_NETWORK = "there is no network in this sandbox"  # in the message of socket.NetworkUnavailable
NETWORK_HINT = (
    "(The sandbox has no network. To use data, put the files in the notebook's folder (the"
    " notebook profile mounts it read-only at /notebook) or in a folder the operator mounts,"
    " or upload them there with Jupyter, then read them by path. %sandbox lists the folders.)"
)
NETWORK_MODULES = {"ssl", "_ssl", "requests", "httpx", "aiohttp", "urllib3"}
# CPython adds this to every ModuleNotFoundError when site is off, as it is in the sandbox
SITE_DISABLED = re.compile(r"\. Site initialization is disabled, did you forget .*$", re.DOTALL)
MODULE_NAME = re.compile(r"'([^']+)'")


def _user_frames(stack):
    return [frame for frame in stack if not frame.filename.startswith(KERNEL_FILES)]


def _location(frame):
    if frame.filename.startswith(CELL_PREFIX):
        return f"{GREEN}{frame.filename}, line {frame.lineno}{RESET}"
    where = f"{GREEN}File {frame.filename}:{frame.lineno}{RESET}"
    return where if frame.name == "<module>" else f"{where}, in {CYAN}{frame.name}(){RESET}"


def _source_excerpt(frame):
    lines = []
    first = max(frame.lineno - CONTEXT, 1)
    for number in range(first, frame.lineno + CONTEXT + 1):
        text = linecache.getline(frame.filename, number)
        if not text:
            if number >= frame.lineno:
                break
            continue
        text = text.rstrip("\n")
        if number == frame.lineno:
            arrow = f"---> {number}".rjust(7, "-") if number < 10 else f"---> {number}"
            lines.append(f"{GREEN}{arrow}{RESET} {text}")
        else:
            lines.append(f"{GREEN}{number:>7}{RESET} {text}")
    return "\n".join(lines)


def _exception_line(report):
    name = report.exc_type.__qualname__ if report.exc_type else "Exception"
    module = getattr(report.exc_type, "__module__", "builtins")
    if module not in ("builtins", "__main__"):
        name = f"{module}.{name}"
    text = str(report)
    first = f"{RED}{name}{RESET}: {text}" if text else f"{RED}{name}{RESET}"
    notes = getattr(report, "__notes__", None) or []
    if issubclass(report.exc_type or Exception, PermissionError) and text.startswith(REFUSED):
        notes = [*notes, REFUSED_HINT]
    elif issubclass(report.exc_type or Exception, ModuleNotFoundError):
        text = SITE_DISABLED.sub("", text)
        first = f"{RED}{name}{RESET}: {text}" if text else f"{RED}{name}{RESET}"
        notes = [*notes, _missing_module_hint(text)]
    elif issubclass(report.exc_type or Exception, OSError):
        hint = {TOO_MANY_FILES: TOO_MANY_FILES_HINT, QUOTA: QUOTA_HINT}.get(text[: len(QUOTA)])
        notes = [*notes, hint] if hint else notes
    return "\n".join([first, *map(str, notes)])


def _missing_module_hint(text):
    """Whether the runtime ships the module, and how to see what it ships."""
    match = MODULE_NAME.search(text)
    name = match.group(1) if match else ""
    top = name.partition(".")[0]
    listing = "help('modules') lists the modules it ships."
    if top in NETWORK_MODULES:
        return (
            f"(The sandbox's runtime does not ship {top}: the sandbox has no network for it"
            f" to use. {listing})"
        )
    if top != name and _ships(top):
        return f"(The sandbox's runtime ships {top}, but not {name}. {listing})"
    if top in sys.stdlib_module_names:
        return (
            f"(The sandbox's runtime, a WASI build of CPython, leaves out this part of the"
            f" standard library. {listing})"
        )
    return (
        f"(The sandbox's runtime does not ship {name or 'this module'}, and nothing can be"
        f" installed into it: no pip, no network. {listing})"
    )


def _ships(name):
    try:
        import importlib.util

        return importlib.util.find_spec(name) is not None
    except Exception:
        return False


def _syntax_error(report):
    chunks = []
    for line in report.format_exception_only():
        line = line.rstrip("\n")
        stripped = line.strip()
        if stripped.startswith('File "') and CELL_PREFIX in stripped:
            name, _, rest = stripped[len('File "') :].partition('"')
            line = f"  {GREEN}{name}{rest}{RESET}"
        elif line.startswith(report.exc_type.__name__):
            name, _, message = line.partition(":")
            line = f"{RED}{name}{RESET}:{message}"
        chunks.append(line)
    return chunks


def _format_one(report):
    if report.exc_type is not None and issubclass(report.exc_type, SyntaxError):
        return _syntax_error(report)
    name = report.exc_type.__name__ if report.exc_type else "Exception"
    if name == "UsageError":  # IPython shows usage errors without a traceback
        return [_exception_line(report)]
    padding = " " * max(42 - len(name), 1)
    chunks = [
        f"{RED}{RULE}{RESET}",
        f"{RED}{name}{RESET}{padding}Traceback (most recent call last)",
    ]
    for frame in _user_frames(report.stack):
        excerpt = _source_excerpt(frame)
        chunks.append(_location(frame) + ("\n" + excerpt + "\n" if excerpt else ""))
    chunks.append(_exception_line(report))
    for group_index, member in enumerate(getattr(report, "exceptions", None) or (), start=1):
        member_text = "\n".join(_format_one(member))
        chunks.append(
            f"+---------------- {group_index} ----------------\n"
            + "\n".join("| " + line for line in member_text.split("\n"))
        )
    return chunks


def format_exception(exc):
    """The traceback of ``exc`` as a list of chunks, oldest chained exception first."""
    report = traceback.TracebackException.from_exception(exc)
    chain = []
    seen = set()
    while report is not None and id(report) not in seen:
        seen.add(id(report))
        if report.__cause__ is not None:
            chain.append(
                (report, "\nThe above exception was the direct cause of the following exception:\n")
            )
            report = report.__cause__
        elif report.__context__ is not None and not report.__suppress_context__:
            chain.append(
                (report, "\nDuring handling of the above exception, another exception occurred:\n")
            )
            report = report.__context__
        else:
            chain.append((report, None))
            report = None
    chunks = []
    for report, link in reversed(chain):
        if link:
            chunks.append(link)
        chunks.extend(_format_one(report))
    if any(NO_NETWORK in str(report) for report, _ in chain):
        chunks.append(NETWORK_HINT)  # once, at the end, however the error was wrapped
    return chunks
