"""Fast unit tests of the host's side of the guest<->host contract and of the settings table.

No kernel and no wasmtime store: ``contract.parse`` is fed what a hostile guest could write,
and the settings are read as the kernel reads them at start. Each test takes milliseconds.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from typing import Any

import pytest
from traitlets.config import Config

from wasm_kernel.guest.modules import _wasm_kernel_contract as declared
from wasm_kernel.sandbox import contract, guest_code
from wasm_kernel.sandbox.limits import DEFAULT_GRACE, Limits
from wasm_kernel.settings import kernel_settings, settings
from wasm_kernel.settings.kernel_settings import KernelSettings
from wasm_kernel.settings.profiles import DEFAULT_PROFILE, PROFILES

pytestmark = pytest.mark.nokernel

# -- building messages from the declarations ----------------------------------------------------

# the smallest value each kind accepts (for CHOICE, the field's first choice)
GOOD = {
    declared.TEXT: "",
    declared.CLIPPED: "",
    declared.LINES: [],
    declared.FLAG: False,
    declared.INTEGER: 0,
    declared.SECONDS: 0,
    declared.OBJECT: {},
    declared.BUNDLE: {"text/plain": "x"},
    declared.WORDS: [],
    declared.ADDRESSES: "",
    declared.ITEMS: [],
    declared.HEADERS: [],
    declared.BYTES: "",
    declared.BUFFERS: [],
}
# what a message's rules require beyond its fields' smallest values
RULED = {declared.COMM.op: {"content": {"comm_id": "c"}}}

# values of the wrong type (or shape) for each kind; a new kind must be added here
BAD = {
    declared.TEXT: [1, 1.5, None, True, [], {}],
    declared.CLIPPED: [1, None, True, ["x"], {}],
    declared.LINES: ["x", None, 1, [1], ["x", None], {"a": "b"}],
    declared.FLAG: [1, 0, "true", None, [], {}],
    declared.INTEGER: [True, False, 1.5, 1.0, "1", None, [], {}],
    declared.SECONDS: [True, "1", None, -1, -0.5, [], {}],
    declared.OBJECT: [[], "x", 1, None, True],
    declared.BUNDLE: [[], "x", 1, None, {"text": "x"}, {"text/plain": 1}],
    declared.CHOICE: ["not a choice", 1, None, True, [], {}],
    declared.WORDS: ["x", None, 1, [1], [None], {}],
    declared.ADDRESSES: [1, None, [], "!!!!", "AAA", "AAA="],
    declared.ITEMS: [{}, "x", None, [1], [[]], [{"source": "no such shape"}]],
    declared.HEADERS: ["x", None, {}, [["a"]], [["a", 1]], [["a", "b", "c"]], [("a", None)]],
    declared.BYTES: [1, None, [], "!!!!", "AAA"],
    declared.BUFFERS: ["x", None, [1], [None], ["!!!!"], ["AAA"], {}, ["AA=="] * 65],
}


def good_value(field: declared.Field) -> Any:
    return field.choices[0] if field.kind == declared.CHOICE else GOOD[field.kind]


def minimal(shape: declared.Message | declared.Shape) -> dict:
    """``shape`` with only its required fields, each at its smallest valid value."""
    return (
        {shape.tag_key: shape.tag}
        | {
            field.name: good_value(field)
            for field in shape.fields
            if field.default is declared.REQUIRED
        }
        | RULED.get(shape.tag, {})
    )


def encode(message: Any) -> bytes:
    return json.dumps(message).encode()


def wrong_type_cases() -> list[Any]:
    """One case per (message, field, bad value); fields of ITEMS' shapes too, as one item."""
    cases = []
    for message in declared.MESSAGES.values():
        for field in message.fields:
            for bad in BAD[field.kind]:
                cases.append(
                    pytest.param(
                        minimal(message) | {field.name: bad},
                        id=f"{message.op}.{field.name}={bad!r}",
                    )
                )
            for shape in field.shapes:
                for inner in shape.fields:
                    for bad in BAD[inner.kind]:
                        item = minimal(shape) | {inner.name: bad}
                        cases.append(
                            pytest.param(
                                minimal(message) | {field.name: [item]},
                                id=f"{message.op}.{field.name}[{shape.tag}].{inner.name}={bad!r}",
                            )
                        )
    return cases


def refused(raw: bytes) -> None:
    with pytest.raises(contract.ProtocolError):
        contract.parse(raw)


# -- the declarations themselves ----------------------------------------------------------------


def test_messages_are_keyed_by_their_op():
    """The table the host looks ops up in must name each message as it names itself."""
    for op, message in declared.MESSAGES.items():
        assert isinstance(message, declared.Message)
        assert op == message.op


def test_services_are_unique():
    """The guest's SERVICES table is a dict built from this tuple: a duplicate would vanish."""
    assert len(set(declared.SERVICES)) == len(declared.SERVICES)


def test_every_declared_kind_has_hostile_cases():
    """A kind added to the contract without hostile cases here would go untested."""
    kinds = {
        field.kind
        for message in declared.MESSAGES.values()
        for field in message.fields + tuple(f for s in _shapes(message) for f in s.fields)
    }
    assert kinds <= set(BAD)


def _shapes(message: declared.Message) -> list[declared.Shape]:
    return [shape for field in message.fields for shape in field.shapes]


# -- parse: what it refuses ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b'{"op": "clear"',
        b"\xff\xfe\xfd",
        b'{"op": "clear", "x": "\xff"}',
        b'{"op": "clear"} trailing',
        b"[" * 100_000,
        b'{"a":' * 100_000,
        b'{"op": "reply", "content": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b"1" * 5000,  # past int's digit limit: ValueError inside json
    ],
    ids=lambda raw: repr(raw[:24]),
)
def test_not_json_is_refused(raw):
    """Bytes that are not one JSON document, or nest deeper than the decoder goes."""
    refused(raw)


@pytest.mark.parametrize("raw", [b"[]", b'["op"]', b"1", b"1.5", b'"clear"', b"null", b"true"])
def test_not_an_object_is_refused(raw):
    refused(raw)


@pytest.mark.parametrize(
    "message",
    [
        {},
        {"op": "no_such_op"},
        {"op": "CLEAR"},
        {"op": ""},
        {"op": 1},
        {"op": None},
        {"op": True},
        {"op": ["clear"]},
        {"op": {"clear": 1}},
        {"op": [[[[["clear"]]]]]},
    ],
    ids=repr,
)
def test_unknown_or_non_string_op_is_refused(message):
    refused(encode(message))


@pytest.mark.parametrize("message", wrong_type_cases())
def test_each_field_of_the_wrong_type_is_refused(message):
    """Derived from the declarations, so a new message or field is covered here at once."""
    refused(encode(message))


@pytest.mark.parametrize("op", sorted(declared.MESSAGES))
def test_each_required_field_missing_is_refused(op):
    message = declared.MESSAGES[op]
    for field in message.fields:
        if field.default is declared.REQUIRED:
            whole = minimal(message)
            del whole[field.name]
            refused(encode(whole))


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "-1", "-0.5", "1e400", "true"])
def test_sleep_seconds_must_be_finite_and_non_negative(value):
    """json reads NaN and Infinity (and 1e400 as inf): a deadline made of one never ends."""
    refused(b'{"op": "sleep", "seconds": ' + value.encode() + b"}")


def test_sleep_seconds_too_large_for_a_float_is_refused():
    """JSON integers are unbounded: one too large for a float must not escape as OverflowError."""
    refused(b'{"op": "sleep", "seconds": 1' + b"0" * 400 + b"}")


@pytest.mark.parametrize(
    "data",
    [
        {"text": "x"},
        {"": "x"},
        {"text/plain": "x", "html": "<b>"},
        {"text/" + "x" * 300: "x"},
        {"text/plain": 1},
        {"text/plain": None},
        {"image/png": True},
    ],
    ids=repr,
)
@pytest.mark.parametrize("op", ["display", "result"])
def test_bad_mime_bundles_are_refused(op, data):
    """Keys must be mime types; values text, or any JSON only under a JSON mime type."""
    refused(encode({"op": op, "data": data}))


def test_result_needs_a_non_empty_bundle():
    refused(encode({"op": "result", "data": {}}))


def test_ename_is_bounded():
    error = {"op": "error", "ename": "E" * 1024, "evalue": "", "traceback": []}
    refused(encode(error))
    assert contract.parse(encode(error | {"ename": "E" * 1023}))["ename"] == "E" * 1023


@pytest.mark.parametrize("op", ["display", "result"])
@pytest.mark.parametrize("transient", [None, {}, {"other": "x"}])
def test_update_needs_a_display_id(op, transient):
    message = {"op": op, "data": {"text/plain": "x"}, "update": True}
    if transient is not None:
        message["transient"] = transient
    refused(encode(message))


@pytest.mark.parametrize("display_id", [1, None, True, [], {}, ["id"]], ids=repr)
def test_display_id_must_be_a_string(display_id):
    refused(encode({"op": "display", "data": {}, "transient": {"display_id": display_id}}))


def test_payload_holds_at_most_16_items():
    item = {"source": "ask_exit"}
    assert len(contract.parse(encode({"op": "payload", "payload": [item] * 16}))["payload"]) == 16
    refused(encode({"op": "payload", "payload": [item] * 17}))


@pytest.mark.parametrize(
    "item",
    [
        {},
        {"source": "evil"},
        {"source": None},
        {"source": 1},
        {"source": "PAGE", "data": {"text/plain": "x"}},
        {"op": "page", "data": {"text/plain": "x"}},
    ],
    ids=repr,
)
def test_payload_item_of_unknown_source_is_refused(item):
    refused(encode({"op": "payload", "payload": [item]}))


@pytest.mark.parametrize("source", [[], ["page"], {}, {"page": 1}], ids=repr)
def test_payload_item_of_unhashable_source_is_refused(source):
    """A list or object as ``source`` must be refused, not raise TypeError looking it up."""
    refused(encode({"op": "payload", "payload": [{"source": source}]}))


def test_page_start_must_not_be_a_boolean():
    page = {"source": "page", "data": {"text/plain": "x"}, "start": True}
    refused(encode({"op": "payload", "payload": [page]}))


def pip(command: Any = "install", args: Any = (), upgrade: Any = False) -> bytes:
    return encode({"op": "pip", "command": command, "args": list(args), "upgrade": upgrade})


@pytest.mark.parametrize("command", ["download", "INSTALL", "install ", "", "wheel"])
def test_pip_command_must_be_declared(command):
    refused(pip(command=command))


def test_pip_args_are_bounded():
    """Each arg at most WORD_LIMIT characters, at most 1000 of them."""
    assert contract.parse(pip(args=["x" * declared.WORD_LIMIT]))["args"] == ["x" * 1000]
    refused(pip(args=["x" * (declared.WORD_LIMIT + 1)]))
    assert len(contract.parse(pip(args=["x"] * 1000))["args"]) == 1000
    refused(pip(args=["x"] * 1001))


@pytest.mark.parametrize(
    "addresses",
    ["!!!!", "AAAA AAAA", "AA==AA==", "é", "AAA", "AAAAA", "AAA=", "AAAAAAA="],
)
def test_immortalize_needs_base64_of_32_bit_words(addresses):
    """Not base64, a text length not a multiple of 4, or bytes not a multiple of 4."""
    refused(encode({"op": "immortalize", "addresses": addresses}))


# -- parse: what it accepts ---------------------------------------------------------------------


@pytest.mark.parametrize("op", sorted(declared.MESSAGES))
def test_minimal_message_of_each_op_parses(op):
    """Only the required fields: the defaults fill in the rest, and nothing else appears."""
    message = declared.MESSAGES[op]
    parsed = contract.parse(encode(minimal(message)))
    assert parsed["op"] == op
    assert set(parsed) == {"op"} | {field.name for field in message.fields}
    assert contract.declaration(parsed) is message


def test_display_defaults_are_filled_in():
    parsed = contract.parse(b'{"op": "display", "data": {"text/plain": "x"}}')
    assert parsed == {
        "op": "display",
        "data": {"text/plain": "x"},
        "metadata": {},
        "transient": {},
        "update": False,
    }


def test_update_with_a_display_id_parses():
    message = {"op": "display", "data": {}, "transient": {"display_id": "d"}, "update": True}
    assert contract.parse(encode(message))["update"] is True


def test_json_payloads_may_be_any_json_under_a_json_mime_type():
    data = {"application/json": 1, "application/vnd.x+json": None, "text/plain": "1"}
    assert contract.parse(encode({"op": "result", "data": data}))["data"] == data


def test_unknown_fields_are_dropped():
    """Only declared fields reach a Jupyter message, in messages and in payload items."""
    page = {"source": "page", "data": {"text/plain": "x"}, "header": {"msg_type": "evil"}}
    parsed = contract.parse(encode({"op": "payload", "payload": [page], "parent_header": {}}))
    assert parsed == {
        "op": "payload",
        "payload": [{"source": "page", "data": {"text/plain": "x"}, "start": 0}],
    }
    parsed = contract.parse(encode({"op": "clear", "wait": True, "channel": "shell"}))
    assert parsed == {"op": "clear", "wait": True}


def test_long_evalue_is_clipped():
    evalue = "v" * (declared.ERROR_TEXT_LIMIT + 10)
    error = {"op": "error", "ename": "E", "evalue": evalue, "traceback": []}
    parsed = contract.parse(encode(error))
    assert parsed["evalue"].startswith("v" * declared.ERROR_TEXT_LIMIT)
    assert "v" * (declared.ERROR_TEXT_LIMIT + 1) not in parsed["evalue"]
    assert parsed["evalue"].endswith("[... truncated]")
    assert len(parsed["evalue"]) < declared.ERROR_TEXT_LIMIT + 100


def test_traceback_is_clipped_in_total():
    """Many lines each under the limit must still be cut all told."""
    lines = ["t" * 1000] * 1000
    error = {"op": "error", "ename": "E", "evalue": "", "traceback": lines}
    parsed = contract.parse(encode(error))
    assert all(isinstance(line, str) for line in parsed["traceback"])
    assert len("\n".join(parsed["traceback"])) < declared.ERROR_TEXT_LIMIT + 100
    assert parsed["traceback"][-1].endswith("[... truncated]")
    short = ["Traceback:", "  line 1", "ValueError: x"]
    assert contract.parse(encode(error | {"traceback": short}))["traceback"] == short


def test_defaults_are_fresh_objects():
    """Mutating one parsed message's defaults must not leak into the next, or the declaration."""
    first = contract.parse(b'{"op": "display", "data": {}}')
    first["metadata"]["leak"] = True
    first["transient"]["display_id"] = "leak"
    second = contract.parse(b'{"op": "display", "data": {}}')
    assert second["metadata"] == {} and second["transient"] == {}
    assert all(
        field.default in ({}, declared.REQUIRED) or not isinstance(field.default, dict)
        for field in declared.DISPLAY.fields
    )


def test_immortalize_addresses_are_bytes():
    parsed = contract.parse(encode({"op": "immortalize", "addresses": "AQAAAAIAAAA="}))
    assert parsed["addresses"] == b"\x01\x00\x00\x00\x02\x00\x00\x00"


def test_http_request_fields_are_read_and_bounded():
    """Headers arrive as pairs, the body as bytes; too many headers, a header or a body past
    its bound are refused before anything is decoded or sent."""
    message = {"op": "http", "method": "POST", "url": "http://h/", "body": "aGk="}
    parsed = contract.parse(encode(message | {"headers": [["A", "1"], ["a", "2"]]}))
    assert parsed["headers"] == [("A", "1"), ("a", "2")] and parsed["body"] == b"hi"
    assert contract.parse(encode(message))["timeout"] == 0.0
    headers_limit = next(f.limit for f in declared.HTTP.fields if f.name == "headers")
    refused(encode(message | {"headers": [["a", "b"]] * (headers_limit + 1)}))
    refused(encode(message | {"headers": [["a", "x" * (declared.HEADER_LIMIT + 1)]]}))
    body_limit = next(f.limit for f in declared.HTTP.fields if f.name == "body")
    refused(encode(message | {"body": "AAAA" * (body_limit // 3 + 2)}))
    refused(encode(message | {"url": "http://h/" + "x" * 9000}))


def test_sleep_seconds_are_floats():
    assert contract.parse(b'{"op": "sleep", "seconds": 2}')["seconds"] == 2.0
    assert isinstance(contract.parse(b'{"op": "sleep", "seconds": 2}')["seconds"], float)


# -- peek_op, oversized_error --------------------------------------------------------------------


@pytest.mark.parametrize("op", sorted(declared.MESSAGES))
def test_peek_op_reads_the_head_of_a_message(op):
    """The guest's json.dumps writes op first; the head alone names the message."""
    whole = encode(minimal(declared.MESSAGES[op]) | {"filler": "x" * 10_000})
    assert contract.peek_op(whole[: contract.PEEK_BYTES]) is declared.MESSAGES[op]
    assert contract.peek_op(b' \n{ "op" :\t"' + op.encode() + b'", ') is declared.MESSAGES[op]


@pytest.mark.parametrize(
    "head",
    [
        b"",
        b"junk",
        b"\xff" * 64,
        b'{"op": "no_such_op"}',
        b'{"op": "displ',
        b'{"data": {}, "op": "display"}',
        b'{"op": 1}',
        b'["op", "display"]',
        b'{"op": "' + b"a" * 17 + b'"}',
        b'{"op": "DISPLAY"}',
    ],
    ids=repr,
)
def test_peek_op_of_junk_is_none(head):
    assert contract.peek_op(head) is None


@pytest.mark.parametrize("size", [0, 1, 10**6, 2**63])
def test_oversized_error_round_trips(size):
    """The host's stand-in for an unreadable error is itself a valid error message."""
    made = contract.oversized_error(size)
    parsed = contract.parse(encode(made))
    assert parsed == made
    assert contract.declaration(parsed) is declared.ERROR
    assert f"{size:,}" in parsed["evalue"]


# -- guest_call ---------------------------------------------------------------------------------


def call_arguments(source: str, entry: declared.EntryPoint) -> list[Any]:
    """The arguments of the one call ``source`` makes, read back as literals, after checking
    that the call is exactly ``__import__(GUEST_MODULE).<entry>(...)``."""
    tree = ast.parse(source)
    assert len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr)
    call = tree.body[0].value
    assert isinstance(call, ast.Call) and not call.keywords
    assert isinstance(call.func, ast.Attribute) and call.func.attr == entry.name
    target = call.func.value
    assert isinstance(target, ast.Call) and ast.unparse(target.func) == "__import__"
    assert [ast.literal_eval(arg) for arg in target.args] == [declared.GUEST_MODULE]
    return [ast.literal_eval(arg) for arg in call.args]


@pytest.mark.parametrize(
    "cell",
    [
        "print('hi')",
        "x = \"it's\" + '\"' + '''\\n'''\n",
        "a\nb\r\nc\rd\x00e\x1b[31m",
        "π = '日本語 🐍 \u200b'",
        "')); __import__('os').system('echo pwned'); (('",
        "\\",
        "",
    ],
)
def test_run_cell_arguments_read_back_exactly(cell):
    """Any source text is passed as a literal: quotes, newlines and unicode cannot break out."""
    arguments = (cell, 7, 123, True, False, {cell: [1, 2]})
    source = contract.guest_call(declared.RUN_CELL, *arguments)
    assert source.startswith(f"__import__({declared.GUEST_MODULE!r}).run_cell(")
    back = call_arguments(source, declared.RUN_CELL)
    assert repr(back) == repr(list(arguments))


def test_nested_plain_data_reads_back_exactly():
    data = {"a": [1, 2.5, -0.0, None, (True, "x")], "b": {"c": ["d"]}, "": 10**30}
    source = contract.guest_call(declared.INSTALL_MODULES, data)
    assert repr(call_arguments(source, declared.INSTALL_MODULES)) == repr([data])


@pytest.mark.parametrize("count", [0, 1, 2, 7, 10])
def test_run_cell_refuses_a_wrong_argument_count(count):
    with pytest.raises(TypeError):
        contract.guest_call(declared.RUN_CELL, *(["x"] * count))


def test_arguments_at_their_defaults_are_left_out():
    """The guest compiles every literal of the call at every turn: trailing arguments equal to
    the declared defaults (same type too) are left out; any other stays, in its place."""
    plain = contract.guest_call(declared.RUN_CELL, "x + 1", 3, 9, True, False, None)
    assert call_arguments(plain, declared.RUN_CELL) == ["x + 1", 3, 9]
    silent = contract.guest_call(declared.RUN_CELL, "x", 3, 9, True, True, None)
    assert call_arguments(silent, declared.RUN_CELL) == ["x", 3, 9, True, True]
    same_value_other_type = contract.guest_call(declared.RUN_CELL, "x", 3, 9, 1, 0, None)
    assert call_arguments(same_value_other_type, declared.RUN_CELL) == ["x", 3, 9, 1, 0]
    with_breakpoints = contract.guest_call(declared.RUN_CELL, "x", 3, 9, True, False, {"f": [2]})
    back = call_arguments(with_breakpoints, declared.RUN_CELL)
    assert back == ["x", 3, 9, True, False, {"f": [2]}]


def _guest_defaults(name: str) -> dict[str, Any]:
    """The defaults of the guest kernel module's function ``name``, read from its source."""
    source = guest_code.kernel_module_source()
    function = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name == name
    )
    arguments = function.args.args
    defaults = function.args.defaults
    named = arguments[len(arguments) - len(defaults) :]
    return {arg.arg: ast.literal_eval(value) for arg, value in zip(named, defaults, strict=True)}


def test_declared_defaults_are_the_guest_functions_own():
    """Leaving an argument out means what passing its declared default meant."""
    for entry in vars(declared).values():
        if isinstance(entry, declared.EntryPoint) and entry.defaults:
            guest = _guest_defaults(entry.name)
            assert {name: guest[name] for name in entry.defaults} == entry.defaults


def test_entry_point_without_parameters_takes_no_arguments():
    assert contract.guest_call(declared.CLOSE_STALE_FILES).endswith(".close_stale_files()")
    with pytest.raises(TypeError):
        contract.guest_call(declared.CLOSE_STALE_FILES, 1)


class _Str(str):
    def __repr__(self) -> str:
        return "__import__('os').system('echo pwned')"


@pytest.mark.parametrize(
    "argument",
    [
        object(),
        _Str("x"),
        float("nan"),
        float("inf"),
        float("-inf"),
        b"bytes",
        {1, 2},
        ["ok", object()],
        {"key": float("nan")},
        {_Str("key"): 1},
        (1, (2, (3, object()))),
        type,
        print,
    ],
    ids=lambda argument: type(argument).__name__,
)
def test_guest_call_refuses_non_plain_data(argument):
    """Only data whose repr is a literal: anything else could run code in the guest."""
    with pytest.raises(TypeError):
        contract.guest_call(declared.RUN_CELL, argument, 1, 2, True, False, {})


@pytest.mark.parametrize("extra", [0, 1, 2, 5, 50])
def test_serve_is_variadic(extra):
    arguments = [f"arg {index}" for index in range(extra)]
    for service in declared.SERVICES:
        source = contract.guest_call(declared.SERVE, service, *arguments)
        assert call_arguments(source, declared.SERVE) == [service, *arguments]


def test_serve_needs_its_service():
    with pytest.raises(TypeError):
        contract.guest_call(declared.SERVE)


# -- guest_turn ---------------------------------------------------------------------------------


def turn_arguments(source: str, entry: declared.EntryPoint) -> list[Any]:
    """The arguments a turn's source carries, after checking that it is one string literal
    (nothing the guest runs but its display hook, given that string) naming ``entry``."""
    tree = ast.parse(source)
    assert len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr)
    literal = tree.body[0].value
    assert isinstance(literal, ast.Constant) and type(literal.value) is str
    name, *arguments = json.loads(literal.value)
    assert name == entry.name
    return arguments


@pytest.mark.parametrize(
    "cell",
    [
        "print('hi')",
        "x = \"it's\" + '\"' + '''\\n'''\n",
        "a\nb\r\nc\rd\x00e\x1b[31m\u2028",
        "π = '日本語 🐍 \u200b'",
        "')); __import__('os').system('echo pwned'); (('",
        '"]); __import__("os").system("echo pwned"); (["',
        "lone \ud800 surrogate \udfff",
        "\\",
        "",
    ],
)
def test_turn_arguments_read_back_exactly(cell):
    """Any source text arrives as it was: quotes, newlines, unicode, lone surrogates (which
    the turn's UTF-8 could not carry as they are) cannot break out or change."""
    arguments = (cell, 7, "1a2b3c4d", True, True, {cell: [1, 2]})
    source = contract.guest_turn(declared.RUN_CELL, *arguments)
    source.encode("utf-8")  # strict: what the host writes into the guest
    assert turn_arguments(source, declared.RUN_CELL) == list(arguments)


def test_turn_leaves_arguments_at_their_defaults_out():
    plain = contract.guest_turn(declared.RUN_CELL, "x + 1", 3, "9", True, False, None)
    assert turn_arguments(plain, declared.RUN_CELL) == ["x + 1", 3, "9"]
    silent = contract.guest_turn(declared.RUN_CELL, "x", 3, "9", True, True, None)
    assert turn_arguments(silent, declared.RUN_CELL) == ["x", 3, "9", True, True]
    assert (
        turn_arguments(contract.guest_turn(declared.CLOSE_STALE_FILES), declared.CLOSE_STALE_FILES)
        == []
    )


@pytest.mark.parametrize(
    "argument",
    [(1, 2), [1, (2, 3)], {1: "x"}, {"a": {None: 1}}, {"a": [(1,)]}],
    ids=["tuple", "nested tuple", "int key", "nested None key", "tuple in a list"],
)
def test_turn_refuses_what_json_would_change(argument):
    """JSON would turn a tuple into a list and a key into a string: refused, not altered."""
    with pytest.raises(TypeError):
        contract.guest_turn(declared.SERVE, declared.DEBUG, argument)


@pytest.mark.parametrize(
    "argument",
    [object(), _Str("x"), float("nan"), float("inf"), b"bytes", {1, 2}, ["ok", print]],
    ids=lambda argument: type(argument).__name__,
)
def test_turn_refuses_non_plain_data(argument):
    with pytest.raises(TypeError):
        contract.guest_turn(declared.SERVE, declared.DEBUG, argument)


def test_turn_checks_the_argument_count():
    with pytest.raises(TypeError):
        contract.guest_turn(declared.CLOSE_STALE_FILES, 1)
    with pytest.raises(TypeError):
        contract.guest_turn(declared.RUN_CELL, "x", 1)


def test_every_entry_point_is_reached_one_way():
    """The install turn's entry points are called as statements (the kernel module cannot take
    turns before it exists); every other one in a turn of its own, through a function of the
    guest's kernel module."""
    install = {declared.INSTALL_MODULES.name, declared.BOOT.name}
    entries = {
        entry.name for entry in vars(declared).values() if isinstance(entry, declared.EntryPoint)
    }
    assert set(declared.TURN_ENTRY_POINTS) == entries - install
    for name in install:
        with pytest.raises(TypeError):
            contract.guest_turn(declared.EntryPoint(name))
    tree = ast.parse(guest_code.kernel_module_source())
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert entries <= functions


# -- the settings table --------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch):
    """No WASM_KERNEL_* variable of the machine running the tests may change the defaults."""
    import os

    for name in list(os.environ):
        if name.startswith(settings.ENV_PREFIX):
            monkeypatch.delenv(name)
    return monkeypatch


def declarations() -> dict[str, Any]:
    return KernelSettings.class_own_traits(config=True)


def test_setting_names_are_the_sorted_config_traits():
    traits = KernelSettings.class_traits(config=True)
    assert kernel_settings.setting_names() == tuple(sorted(traits))
    assert kernel_settings.setting_names() == tuple(sorted(declarations()))


def test_every_setting_declares_its_default(clean_env):
    """Every setting is a checked Setting whose default is a value it accepts, its profile's,
    or worked out from its profile."""
    owner = KernelSettings()
    for name, trait in declarations().items():
        assert isinstance(trait, settings.Setting), name
        default = trait.declared
        if default == settings.FROM_PROFILE or isinstance(default, settings.PerProfile):
            continue
        assert trait.validate(owner, default) == default, name


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_profile_defaults_name_profile_fields(profile, clean_env):
    """A FROM_PROFILE setting reads the profile's field of its name: it must exist and be valid."""
    owner = KernelSettings()
    fields = {field.name for field in dataclasses.fields(PROFILES[profile])}
    for name, trait in declarations().items():
        if trait.declared == settings.FROM_PROFILE:
            assert name in fields, f"profile {profile} has no field {name}"
            value = getattr(PROFILES[profile], name)
            trait.validate(owner, value)  # raises if the profile's own value is refused


def test_fresh_settings_are_the_notebook_profiles(clean_env):
    chosen = KernelSettings()
    configured = chosen.read_settings()
    assert configured == set()
    assert chosen.refused == []
    assert chosen.profile == DEFAULT_PROFILE == "notebook"
    profile = PROFILES["notebook"]
    for name, trait in declarations().items():
        if trait.declared == settings.FROM_PROFILE:
            value = getattr(chosen, name)
            expected = getattr(profile, name)
            if isinstance(expected, tuple):
                value = tuple(value)
            assert value == expected, name
    assert chosen.history_file == kernel_settings.history_file(profile)
    assert chosen.interrupt_grace == DEFAULT_GRACE


def test_limits_of_fresh_settings_match_them(clean_env):
    chosen = KernelSettings()
    limits = Limits.of(chosen)
    for field in dataclasses.fields(Limits):
        assert getattr(limits, field.name) == getattr(chosen, field.name), field.name
    assert limits == Limits.of(PROFILES["notebook"])


def test_a_refused_environment_value_falls_back_and_is_recorded(clean_env):
    """A bad WASM_KERNEL_FUEL must not end the kernel nor be used: recorded once, default used."""
    clean_env.setenv("WASM_KERNEL_FUEL", "abc")
    chosen = KernelSettings()
    assert chosen.fuel == PROFILES[DEFAULT_PROFILE].fuel
    chosen.read_settings()
    assert len(chosen.refused) == 1
    assert "WASM_KERNEL_FUEL" in chosen.refused[0]
    assert chosen.refused[0].startswith("WasmKernel.fuel = 'abc'")


def test_profile_from_the_environment_switches_defaults(clean_env):
    clean_env.setenv("WASM_KERNEL_PROFILE", "strict")
    chosen = KernelSettings()
    strict = PROFILES["strict"]
    assert chosen.profile == "strict"
    assert Limits.of(chosen) == Limits.of(strict)
    assert tuple(chosen.mounts) == strict.mounts
    assert chosen.packages == strict.packages
    assert chosen.snapshots is strict.snapshots and chosen.hibernate is strict.hibernate
    assert chosen.history_file == ":memory:"
    assert chosen.refused == []


def test_screened_drops_a_refused_config_value(clean_env):
    """traitlets would raise loading 'lots', ending the kernel: it is dropped and reported."""
    config = Config()
    config.WasmKernel.fuel = "lots"
    config.WasmKernel.time_limit = 30
    refusals = []
    result = kernel_settings.screened(config, None, lambda *args: refusals.append(args))
    assert "fuel" not in result.WasmKernel
    assert result.WasmKernel.time_limit == 30
    assert len(refusals) == 1
    name, value, source, reason = refusals[0]
    assert (name, value) == ("fuel", "lots")
    assert source == "the configuration"
    assert "fuel" in reason
    assert config.WasmKernel.fuel == "lots"  # the caller's config is left as it was


def test_screened_leaves_valid_config_alone():
    config = Config()
    config.WasmKernel.fuel = 10**10
    calls = []
    result = kernel_settings.screened(config, None, lambda *args: calls.append(args))
    assert result.WasmKernel.fuel == 10**10 and calls == []


def test_settings_import_no_kernel_machinery():
    """--help-all, the client and the MCP server read the settings without wasmtime or ZMQ."""
    heavy = ("wasmtime", "ipykernel", "zmq")
    code = (
        "import sys, wasm_kernel.settings.kernel_settings;"
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == ""


def test_every_message_declares_a_bound_the_host_can_read() -> None:
    """Each message's ``limit`` is at most MESSAGE_LIMIT (the host reads nothing larger);
    those with an error in their reply are answered past it with the bound named."""
    for message in declared.MESSAGES.values():
        assert 0 < message.limit <= declared.MESSAGE_LIMIT, message.op
    refusal = contract.too_large(declared.TOOL, declared.TOOL.limit + 1)
    assert refusal is not None and refusal["error"]["ename"] == "ValueError"
    assert f"{declared.TOOL.limit:,} bytes" in refusal["error"]["evalue"]
    refusal = contract.too_large(declared.COMM, declared.COMM.limit + 1)
    assert refusal is not None and f"{declared.COMM.limit:,} bytes" in refusal["error"]
    assert contract.too_large(declared.DISPLAY, declared.MESSAGE_LIMIT + 1) is None
