"""Every message survives encode → decode, and drift fails strict decoding."""

from __future__ import annotations

from typing import get_type_hints

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hcs_bus import messages
from hcs_bus.messages import ALL_MESSAGES


def _struct_strategy(kind: type[msgspec.Struct]) -> st.SearchStrategy[msgspec.Struct]:
    hints = get_type_hints(kind)
    fields = {
        f.name: st.from_type(hints[f.name]) for f in msgspec.structs.fields(kind) if f.name != "v"
    }
    return st.builds(kind, **fields)


# JSON numbers: finite floats and 64-bit integers, as every subscriber can read them.
st.register_type_strategy(float, st.floats(allow_nan=False, allow_infinity=False))
st.register_type_strategy(int, st.integers(min_value=-(2**63), max_value=2**63 - 1))
for _kind in vars(messages).values():
    if isinstance(_kind, type) and issubclass(_kind, msgspec.Struct):
        st.register_type_strategy(_kind, _struct_strategy(_kind))


@pytest.mark.parametrize("kind", ALL_MESSAGES, ids=lambda k: k.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_message_round_trips(kind: type[msgspec.Struct], data: st.DataObject) -> None:
    value = data.draw(st.from_type(kind))
    raw = messages.encode(value)
    assert messages.decode(raw, kind) == value
    assert messages.decode_strict(raw, kind) == value


def test_an_unknown_field_is_ignored_leniently_but_refused_strictly() -> None:
    event = messages.HealthEvent(
        node="n1", kind="xid", severity="fatal", source="probe", time_s=1.0, code=79
    )
    raw = msgspec.json.decode(messages.encode(event))
    raw["brand_new_field"] = 1
    data = msgspec.json.encode(raw)
    assert messages.decode(data, messages.HealthEvent) == event
    with pytest.raises(msgspec.ValidationError, match="brand_new_field"):
        messages.decode_strict(data, messages.HealthEvent)


def test_a_fingerprint_from_an_agent_that_knows_no_driver_hold_promises_its_total() -> None:
    device = messages.DeviceFingerprint(
        index=0,
        uuid="u",
        vendor="huawei",
        model="Ascend910B2",
        vram_total_mib=65536,
        vram_free_mib=62375,
        compute=messages.Compute(acu_profile=1.0, tflops_fp16_profile=1.0),
        vram_driver_mib=3161,
    )
    node = messages.NodeFingerprint(
        node="n1", agent_version="old", boot_id="b", seq=1, time_s=1.0, devices=(device,)
    )
    raw = msgspec.json.decode(messages.encode(node))
    assert messages.decode(msgspec.json.encode(raw), messages.NodeFingerprint) == node
    assert node.devices[0].vram_usable_mib == 62375
    del raw["devices"][0]["vram_driver_mib"]  # what an agent before the field sends
    (old,) = messages.decode(msgspec.json.encode(raw), messages.NodeFingerprint).devices
    assert (old.vram_driver_mib, old.vram_usable_mib) == (0, 65536)
    over = msgspec.structs.replace(device, vram_driver_mib=70000)
    assert over.vram_usable_mib == 0


def test_a_message_of_another_type_is_refused_by_its_tag() -> None:
    plan = messages.encode(messages.Plan(ok=False, reason="none fits"))
    with pytest.raises(msgspec.ValidationError):
        messages.decode(plan, messages.HealthEvent)


@pytest.mark.parametrize(
    "poison",
    [b'{"type": "node_fingerprint", "node": "\xff\xfe"}', b"[" * 2000 + b"]" * 2000],
    ids=["invalid-utf8", "deeply-nested"],
)
def test_every_undecodable_message_is_a_msgspec_decode_error(poison: bytes) -> None:
    """Deep nesting escapes msgspec as RecursionError (and invalid UTF-8, before
    msgspec 0.23, as UnicodeDecodeError); callers that catch msgspec's errors
    must see them too."""
    with pytest.raises(msgspec.DecodeError):
        messages.decoder_for(messages.NodeFingerprint).decode(poison)
    with pytest.raises(msgspec.DecodeError):
        messages.decode(poison, messages.NodeReservations)
