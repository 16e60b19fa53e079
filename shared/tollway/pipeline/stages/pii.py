"""Reversible PII tokenization as a stage: placeholders out, exact values back (docs/pii.md).

``before`` tokenizes the decoded request in place (every client format shares the canonical types,
so Chat Completions, Messages, Responses and Embeddings alike), so the codecs only ever serialize
the tokenized request. A buffered answer is restored in ``after``; a stream through a transform that
holds back at most one placeholder's length of text per channel (the text, and each tool call's
arguments), so the first token barely waits. Thinking blocks are left alone: the provider signed
them as written, and a client sends them back as received.

``finish`` drops the request's mapping (values referenced nowhere else) and leaves the manifest on
the call for the audit stage: profile and detector version, counts per kind, a digest of the
tokenized texts the provider was sent, and how recovery went. Never a value or a placeholder.

In ``session`` and ``host`` scope each new placeholder is also put in the vault before any provider
work (a vault that cannot take it fails the request with a 503), and a buffered answer's
placeholder that verifies under the scope but is not this request's is looked up there. A session's
placeholder ids are keyed hashes of its values, so the same values come back on every turn: the
stage remembers, per process and bounded (``STORED_CACHE_SIZE``), until when each id it stored (or
found stored) lives, and writes it again only after that, so a turn that repeats the conversation
costs no vault write (and no KMS data key) for what an earlier turn stored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Literal

from tollway.canonical import (
    CanonicalRequest,
    CanonicalResponse,
    Message,
    StreamEvent,
    StreamFinish,
    StreamUsage,
    TextDelta,
    ToolCallDelta,
)
from tollway.exceptions import InvalidRequest, PiiUnavailable, PiiUnresolved, UnsupportedParameter
from tollway.pii.placeholders import PLACEHOLDER_RE, scope_binding
from tollway.pii.policy import ENRICHMENT, PiiKeys, PiiProfile, Tokenized, Tokenizer
from tollway.pii.recovery import Mapping, Outcomes, StreamRecoverer, json_string_escape, recover
from tollway.pii.vault.base import PiiVault, TokenExists, VaultEntry, VaultError
from tollway.pipeline.stage import BaseStage, Call, StreamTransform

__all__ = ["PiiStage", "PiiState"]

log = logging.getLogger("tollway.pii")

VaultFactory = Callable[[], PiiVault]

STORED_CACHE_SIZE = 65_536
"""Token ids whose vault entry this process knows to be live: about 100 bytes each."""
_STORED_MARGIN_S = 5.0
"""An entry this close to its deadline is written again (a replica's clock may run ahead)."""

_MODEL_THREAD: list[ThreadPoolExecutor] = []


def _model_thread() -> ThreadPoolExecutor:
    """The one thread a model-backed detector runs in: off the event loop, one scan at a time
    (a spaCy pipeline is not documented as safe to call from several threads at once)."""
    if not _MODEL_THREAD:
        _MODEL_THREAD.append(ThreadPoolExecutor(1, thread_name_prefix="tollway-pii-model"))
    return _MODEL_THREAD[0]


@dataclass(slots=True, eq=False)
class PiiState:
    """One request's PII work: its mapping (cleared at the end) and what the audit trail gets."""

    profile: PiiProfile
    keys: PiiKeys
    mapping: Mapping
    binding: bytes
    tokenized: Tokenized
    digest: str
    outcomes: Outcomes = field(default_factory=Outcomes)
    recovered: set[str] = field(default_factory=set)
    """The placeholders that came back and resolved (to count the ones the model omitted)."""

    def resolve(self, token: str) -> str | None:
        value = self.mapping.resolve(token)
        if value is not None:
            self.recovered.add(token)
        return value

    def manifest(self) -> dict[str, object]:
        """The audit trail's ``pii`` object: metadata only."""
        o = self.outcomes
        return {
            "profile": self.profile.id,
            "detectorVersion": self.profile.version,
            "scope": self.profile.scope,
            "counts": dict(self.tokenized.counts),
            "digest": self.digest,
            "recovery": {
                "exact": o.exact,
                "leftMasked": o.left_masked,
                "nearMiss": o.near_miss,
                "omitted": self.omitted,
            },
        }

    omitted_count: int | None = None

    @property
    def omitted(self) -> int:
        """Placeholders sent that never came back (not an error: an answer need not repeat them)."""
        if self.omitted_count is not None:
            return self.omitted_count
        return sum(1 for token, _, _ in self.tokenized.minted if token not in self.recovered)

    def end(self) -> None:
        """Keep the counts, drop every value: the mapping, and the minted list the vault was fed from."""
        self.omitted_count = self.omitted
        self.tokenized.minted.clear()
        self.mapping.clear()


class PiiStage(BaseStage):
    name = "pii"
    __slots__ = ("_stored", "_vault", "_vault_factory")

    def __init__(self, vault_factory: VaultFactory | None = None) -> None:
        self._vault_factory = vault_factory
        self._vault: PiiVault | None = None
        self._stored: dict[str, float] = {}
        """Token id → the deadline of its live vault entry; oldest first, bounded."""

    def _vault_for(self) -> PiiVault:
        if self._vault is None:
            if self._vault_factory is None:
                raise PiiUnavailable()
            self._vault = self._vault_factory()
        return self._vault

    async def before(self, call: Call) -> None:
        ctx, req, plan = call.ctx, call.request, call.alias
        assert ctx is not None and req is not None and plan is not None
        profile = plan.pii
        keys = ctx.root.pii_keys
        assert profile is not None
        if keys is None:  # pragma: no cover - publication refuses a PII alias without a key
            raise PiiUnavailable()
        if req.stream and not profile.streaming:
            raise UnsupportedParameter(
                f"'stream' is not supported by model '{plan.name}': its PII policy checks the whole answer first.",
                param="stream",
            )
        principal = ctx.principal
        if profile.scope == "request":
            binding = scope_binding("request", principal.tenant, principal.id, ctx.request_id)
        elif profile.scope == "session":
            if ctx.session_id is None:
                header = ctx.root.limits.session_header
                raise InvalidRequest(
                    f"Model '{plan.name}' keeps personal data per session: send the '{header}' header.", param=header
                )
            binding = scope_binding("session", principal.tenant, principal.id, ctx.session_id)
        else:
            binding = scope_binding("host", principal.tenant)
        mapping = Mapping(keys.minter, binding)
        tokenizer = Tokenizer(profile, mapping, keys, binding)
        if profile.offload:
            await asyncio.get_running_loop().run_in_executor(_model_thread(), tokenizer.request, req)
        else:
            tokenizer.request(req)
        out = tokenizer.out
        if out.minted and profile.enrichment and isinstance(req, CanonicalRequest):
            req.messages.insert(0, Message("system", ENRICHMENT))
        state = call.pii = PiiState(profile, keys, mapping, binding, out, tokenizer.digest())
        if out.minted and profile.scope != "request":
            try:
                await self._store(out, binding, principal.tenant, profile)
            except BaseException:
                state.end()  # finish never runs for a stage whose before raised: drop the values here
                raise

    async def _store(self, out: Tokenized, binding: bytes, tenant: str, profile: PiiProfile) -> None:
        vault = self._vault_for()
        now = time.time()
        expires = now + profile.ttl_s
        scope: Literal["session", "host"] = "host" if profile.scope == "host" else "session"
        stored = self._stored
        for token, kind, value in out.minted:
            match = PLACEHOLDER_RE.fullmatch(token)
            assert match is not None
            token_id = match.group(2)
            if stored.get(token_id, 0.0) > now + _STORED_MARGIN_S:
                continue
            entry = VaultEntry(token_id, kind, binding, tenant, expires, scope=scope)
            try:
                await vault.insert(entry, value)
            except TokenExists as exc:
                # The same value earlier in this session (its id is a keyed hash of it): remember until
                # when it lives; a revoked one is not remembered, and stays revoked.
                if exc.expires_at is not None:
                    self._remember(token_id, exc.expires_at)
                continue
            except VaultError as exc:
                log.error("PII vault insert failed: %s", type(exc).__name__)
                raise PiiUnavailable() from None
            self._remember(token_id, entry.deadline)

    def _remember(self, token_id: str, deadline: float) -> None:
        stored = self._stored
        stored.pop(token_id, None)
        if len(stored) >= STORED_CACHE_SIZE:
            del stored[next(iter(stored))]
        stored[token_id] = deadline

    async def after(self, call: Call, response: CanonicalResponse) -> None:
        state = call.pii
        if state is None:
            return
        if state.profile.scope != "request":
            await self._prefetch(state, response)
        outcomes = state.outcomes
        resolve = state.resolve
        if response.content:
            response.content, got = recover(response.content, resolve)
            outcomes.add(got)
        if response.refusal:
            response.refusal, got = recover(response.refusal, resolve)
            outcomes.add(got)
        if response.tool_calls:
            calls = []
            for c in response.tool_calls:
                arguments, got = recover(c.arguments, resolve, json_string_escape)
                outcomes.add(got)
                calls.append(c if arguments is c.arguments else replace(c, arguments=arguments))
            response.tool_calls = calls
        if state.profile.unresolved == "reject-buffered" and outcomes.unresolved:
            raise PiiUnresolved()

    async def _prefetch(self, state: PiiState, response: CanonicalResponse) -> None:
        """A durable scope's placeholders that are not this request's: looked up in the vault, only
        once their MAC verifies under the scope (a forged one costs no I/O)."""
        texts = [response.content or "", response.refusal or ""]
        texts.extend(c.arguments for c in response.tool_calls or ())
        minter, mapping = state.keys.minter, state.mapping
        wanted: dict[str, str] = {}
        for text in texts:
            for match in PLACEHOLDER_RE.finditer(text):
                token = match.group(0)
                if token in wanted or mapping.resolve(token) is not None:
                    continue
                if minter.verify(token, state.binding) is not None:
                    wanted[token] = match.group(2)
        if not wanted:
            return
        vault = self._vault_for()
        now = time.time()
        for token, token_id in wanted.items():
            try:
                value = await vault.resolve(token_id, state.binding, now)
            except VaultError:
                continue  # left masked: the vault's failure never reveals or breaks more
            if value is not None:
                try:
                    state.mapping.insert(token, value)
                except ValueError:
                    continue

    def transform(self, call: Call) -> StreamTransform | None:
        state = call.pii
        return _Recovery(state) if state is not None else None

    async def finish(self, call: Call) -> None:
        state = call.pii
        if state is not None:
            state.end()

    async def aclose(self) -> None:
        if self._vault is not None:
            await self._vault.aclose()


class _Recovery:
    """A stream's restoration: one recoverer for the text, one per tool call's arguments."""

    __slots__ = ("_outcomes", "_resolve", "_text", "_tools")

    def __init__(self, state: PiiState) -> None:
        self._resolve = state.resolve
        self._outcomes = state.outcomes
        self._text = StreamRecoverer(self._resolve, None, self._outcomes)
        self._tools: dict[int, StreamRecoverer] = {}

    def feed(self, ev: StreamEvent) -> Iterable[StreamEvent]:
        kind = type(ev)
        if kind is TextDelta:
            text = ev.text  # type: ignore[union-attr]
            out = self._text.feed(text)
            if out is text:
                return (ev,)
            return (TextDelta(out),) if out else ()
        if kind is ToolCallDelta:
            return self._tool(ev)  # type: ignore[arg-type]
        if kind is StreamFinish or kind is StreamUsage:
            return (*self.flush(), ev)
        return (ev,)

    def _tool(self, ev: ToolCallDelta) -> Iterable[StreamEvent]:
        before: list[StreamEvent] = []
        recoverer = self._tools.get(ev.index)
        if recoverer is None:  # a new call: the text and the calls before it are complete
            before.extend(self.flush())
            recoverer = self._tools[ev.index] = StreamRecoverer(self._resolve, json_string_escape, self._outcomes)
        out = recoverer.feed(ev.arguments)
        if out is ev.arguments:
            before.append(ev)
        elif out or ev.id is not None or ev.name is not None:
            before.append(replace(ev, arguments=out))
        return before

    def flush(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        text = self._text.flush()
        if text:
            out.append(TextDelta(text))
        for index, recoverer in self._tools.items():
            rest = recoverer.flush()
            if rest:
                out.append(ToolCallDelta(index, arguments=rest))
        return out
