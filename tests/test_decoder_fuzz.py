"""Property: every bus decoder turns any bytes into a value of its type or a
``msgspec.DecodeError`` (the wrapped error consumers dead-letter on), never
another exception; and every valid message survives encode → decode.

The decoders are found mechanically: every ``msgspec.Struct`` defined in
``hcs_bus.messages`` (so a new message type is fuzzed without touching this
file), the ``Message`` union, and ``ALL_MESSAGES`` must list every tagged one.
Strategies for valid messages are derived from the type hints.
"""

from __future__ import annotations

import gc
import json
import sys
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hcs_bus import messages


def _structs() -> list[type[msgspec.Struct]]:
    return sorted(
        (
            kind
            for kind in vars(messages).values()
            if isinstance(kind, type)
            and issubclass(kind, msgspec.Struct)
            and kind.__module__ == messages.__name__
            and not kind.__name__.startswith("_")
        ),
        key=lambda kind: kind.__name__,
    )


STRUCTS = _structs()
TAGGED = [k for k in STRUCTS if k.__struct_config__.tag is not None]
DECODED: list[Any] = [*STRUCTS, messages.Message]  # everything a consumer may decode

FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)
RAW_NUMBERS = ["1e400", "-1e400", "9" * 400, "-" + "9" * 400, "1e-400", "NaN", "Infinity", "0x10"]


def strategy_for(hint: Any) -> st.SearchStrategy[Any]:
    """Valid values of a message field type (JSON numbers: finite, 64-bit)."""
    origin, args = get_origin(hint), get_args(hint)
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return _struct_strategy(hint)
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (Union, types.UnionType):
        return st.one_of(*(strategy_for(a) for a in args))
    if origin is tuple:
        return st.lists(strategy_for(args[0]), max_size=2).map(tuple)
    if origin is dict:
        return st.dictionaries(strategy_for(args[0]), strategy_for(args[1]), max_size=2)
    simple: dict[Any, st.SearchStrategy[Any]] = {
        str: st.text(max_size=16),
        bool: st.booleans(),
        int: st.integers(min_value=-(2**63), max_value=2**63 - 1),
        float: st.floats(allow_nan=False, allow_infinity=False),
        type(None): st.none(),
    }
    if hint in simple:
        return simple[hint]
    raise AssertionError(f"no strategy for field type {hint!r}: teach strategy_for")


def _struct_strategy(kind: type[msgspec.Struct]) -> st.SearchStrategy[msgspec.Struct]:
    hints = get_type_hints(kind, vars(messages))
    fields = {
        f.name: st.deferred(lambda h=hints[f.name]: strategy_for(h))
        for f in msgspec.structs.fields(kind)
        if f.name != "v"
    }
    return st.builds(kind, **fields)


def sample(hint: Any) -> Any:
    """One valid value with every field filled (the template hostile bytes start from)."""
    origin, args = get_origin(hint), get_args(hint)
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        hints = get_type_hints(hint, vars(messages))
        fields = msgspec.structs.fields(hint)
        return hint(**{f.name: sample(hints[f.name]) for f in fields if f.name != "v"})
    if origin is Literal:
        return args[-1]
    if origin in (Union, types.UnionType):
        return sample(next(a for a in args if a is not type(None)))
    if origin is tuple:
        return (sample(args[0]), sample(args[0]))
    if origin is dict:
        return {sample(args[0]): sample(args[1])}
    return {str: "x-1", bool: True, int: 7, float: 1.5}[hint]


def _check(kind: Any, data: bytes) -> None:
    """The property itself: a value of ``kind`` or a DecodeError, nothing else."""
    try:
        value = messages.decoder_for(kind).decode(data)
    except msgspec.DecodeError:
        return
    wanted = get_args(kind) or (kind,)
    assert isinstance(value, wanted), (kind, data[:200], value)


def _plant(doc: Any, *, at: int, raw: str) -> bytes:
    """``doc`` as JSON with its ``at``-th value replaced by the text ``raw``."""
    marker = "__fuzz_marker__"
    spots: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in list(items):
            spots.append((node, key))
            if isinstance(value, dict | list):
                walk(value)

    if isinstance(doc, dict | list):
        walk(doc)
    if not spots:
        return raw.encode()
    parent, key = spots[at % len(spots)]
    parent[key] = marker
    return json.dumps(doc).replace(f'"{marker}"', raw).encode()


@st.composite
def hostile(draw: st.DrawFn, kind: Any) -> bytes:
    """Bytes shaped like a ``kind`` message and then broken on purpose."""
    members = get_args(kind) or (kind,)
    valid = messages.encode(sample(draw(st.sampled_from(members))))
    how = draw(st.sampled_from(["bytes", "json", "planted", "raw", "utf8", "cut", "deep", "extra"]))
    if how == "bytes":
        return draw(st.binary(max_size=200))
    if how == "json":
        return json.dumps(draw(json_values)).encode()
    doc = json.loads(valid)
    at = draw(st.integers(min_value=0, max_value=200))
    if how == "planted":
        return _plant(doc, at=at, raw=json.dumps(draw(json_values)))
    if how == "raw":
        return _plant(doc, at=at, raw=draw(st.sampled_from(RAW_NUMBERS)))
    if how == "utf8":  # an invalid UTF-8 sequence inside a string or anywhere
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80"]))
        cut = valid.find(b'"', at % len(valid)) + 1 or at % len(valid)
        return valid[:cut] + bad + valid[cut:]
    if how == "cut":
        return valid[: at % len(valid)]
    if how == "deep":
        depth = draw(st.integers(min_value=500, max_value=5000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        return _plant(doc, at=at, raw=opener * depth + "1" + closer * depth)
    key = draw(st.text(min_size=1, max_size=8))  # a newer producer's field
    doc[key] = draw(json_values)
    return json.dumps(doc).encode()


def test_every_tagged_struct_is_a_registered_message() -> None:
    """A new message type must be in ALL_MESSAGES and the Message union
    (which is how consumers, the DLQ and the round-trip tests find it)."""
    assert set(TAGGED) == set(messages.ALL_MESSAGES)
    assert set(TAGGED) == set(get_args(messages.Message))
    assert len(STRUCTS) > len(TAGGED) >= 9  # the scan did find the module's structs


@pytest.mark.parametrize("kind", DECODED, ids=lambda k: getattr(k, "__name__", "Message"))
@FUZZ
@given(data=st.binary(max_size=300))
def test_any_bytes_decode_to_a_value_or_a_decode_error(kind: Any, data: bytes) -> None:
    _check(kind, data)


@pytest.mark.parametrize(
    "kind", [*TAGGED, messages.Message], ids=lambda k: getattr(k, "__name__", "Message")
)
@FUZZ
@given(data=st.data())
def test_broken_messages_decode_to_a_value_or_a_decode_error(
    kind: Any, data: st.DataObject
) -> None:
    _check(kind, data.draw(hostile(kind)))


@pytest.mark.parametrize("kind", TAGGED, ids=lambda k: k.__name__)
@settings(FUZZ, max_examples=25)
@given(data=st.data())
def test_every_valid_message_round_trips(kind: type[msgspec.Struct], data: st.DataObject) -> None:
    """Nested structs are drawn inside the tagged messages that carry them."""
    value = data.draw(_struct_strategy(kind))
    raw = messages.encode(value)
    assert messages.decode(raw, kind) == value
    assert messages.decode(raw, messages.Message) == value  # found by its tag
    assert messages.decode_strict(raw, kind) == value


@pytest.mark.parametrize("kind", STRUCTS, ids=lambda k: k.__name__)
def test_no_message_is_tracked_by_the_garbage_collector(kind: type[msgspec.Struct]) -> None:
    """Decoded by the ten thousand, they must not cause full-collection pauses."""
    value = messages.decode(messages.encode(sample(kind)), kind)
    assert not gc.is_tracked(value)
    assert not gc.is_tracked(sample(kind))


def test_the_property_can_fail() -> None:
    """A decoder that lets msgspec's raw errors out is caught by ``_check``:
    deep nesting makes msgspec raise ``RecursionError``. msgspec's depth
    follows the interpreter's recursion limit, which hypothesis raises for
    its own tests: it is held at 1,000 here."""
    poison = b'{"type": "health_event", "x": ' + b'{"a": ' * 2000 + b"1" + b"}" * 2000 + b"}"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        with pytest.raises(RecursionError):
            msgspec.json.Decoder(messages.HealthEvent).decode(poison)
        _check(messages.HealthEvent, poison)  # the wrapped decoder: a DecodeError
    finally:
        sys.setrecursionlimit(limit)
    # invalid UTF-8: msgspec before 0.23 let UnicodeDecodeError out; the wrapper never does
    with pytest.raises(msgspec.DecodeError):
        messages.decoder_for(messages.HealthEvent).decode(
            b'{"type": "health_event", "node": "\xff"}'
        )
    assert typing.get_origin(messages.Message) in (Union, types.UnionType)
