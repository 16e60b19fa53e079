"""Property: whatever JSON a client sends, parsing answers a canonical request or a 4xx error, never a crash."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tollway.api.chat_request import _MESSAGE_KEYS as _MESSAGE_FIELDS
from tollway.api.chat_request import _PROFILE, _SDK_DEFAULTS, parse_body, to_canonical
from tollway.canonical import CanonicalRequest
from tollway.exceptions import GatewayError
from tollway.routing.plan import AliasPlan, RetryPolicy

_PLAN = AliasPlan(
    name="chat-fast-v1",
    capabilities=frozenset({"streaming", "tools", "vision", "json_object", "json_schema"}),
    max_input_tokens=100_000,
    max_output_tokens=4096,
    default_max_output_tokens=256,
    allowed_parameters=frozenset(),
    reject_unknown_parameters=True,
    groups=(),
    retry=RetryPolicy(3, 0.1, 1.0, frozenset({429, 503})),
)

_scalars = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=20)
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)

_PART_KEYS = ["type", "text", "image_url"]
_MESSAGE_KEYS = sorted(_MESSAGE_FIELDS | {"refusal"})
_BODY_KEYS = sorted((_PROFILE - {"model", "messages"}) | set(_SDK_DEFAULTS))
"""The parser's own field tables, so the strategy follows the profile as it grows."""


def _shaped(keys: list[str], value: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects whose keys are mostly the real field names, with values of any JSON type."""
    return st.dictionaries(st.sampled_from(keys) | st.text(max_size=8), value, max_size=len(keys))


_good_roles = st.sampled_from(["system", "developer", "user", "assistant", "tool"])
_parts = st.lists(
    _shaped(_PART_KEYS, json_values | st.sampled_from(["text", "image_url"]))
    | st.fixed_dictionaries(
        {"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": st.text(max_size=40) | json_values})}
    ),
    max_size=3,
)
_messages = st.lists(
    _shaped(_MESSAGE_KEYS, json_values | _good_roles | _parts)
    | st.fixed_dictionaries(
        {"role": _good_roles | json_values, "content": st.text(max_size=20) | _parts | json_values}
    ),
    max_size=4,
)
bodies = st.fixed_dictionaries(
    {"model": st.just("chat-fast-v1") | json_values, "messages": _messages | json_values},
    optional=dict.fromkeys(_BODY_KEYS, json_values),
)


def _outcome(raw: bytes) -> CanonicalRequest | GatewayError:
    try:
        return to_canonical(parse_body(raw), _PLAN)
    except GatewayError as err:
        return err


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies)
def test_any_envelope_parses_or_is_a_client_error(body: dict[str, Any]) -> None:
    outcome = _outcome(orjson.dumps(body))
    if isinstance(outcome, GatewayError):
        assert 400 <= outcome.status < 500, outcome
        assert outcome.code is not None
        assert len(outcome.message) < 1000
    else:
        assert isinstance(outcome, CanonicalRequest)
        assert outcome.messages


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64) | json_values.map(orjson.dumps))
def test_any_bytes_parse_or_are_a_client_error(raw: bytes) -> None:
    outcome = _outcome(raw)
    assert isinstance(outcome, CanonicalRequest) or 400 <= outcome.status < 500


def test_an_unhashable_role_is_a_400_naming_the_field() -> None:
    for role in ([], {}, [1]):
        outcome = _outcome(orjson.dumps({"model": "m", "messages": [{"role": role, "content": "hi"}]}))
        assert isinstance(outcome, GatewayError)
        assert outcome.status == 400 and outcome.param == "messages[0].role"
