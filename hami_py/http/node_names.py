"""Decoding ExtenderArgs whose NodeNames kube-scheduler has sent before.

A /filter body is the pod (a few KB) and then the names of every feasible node: at 5 000 nodes
some 90 KB of names, and decoding them into 5 000 strings is most of what parsing the request
costs. kube-scheduler sends the same feasible list for most pods (every node that passed its own
filters), so the bytes after ``"NodeNames":`` repeat from one request to the next. When they do,
only the part before them is decoded, and the names are the list decoded the last time.

That part alone is decoded as ``<prefix>null}``: a complete JSON document only when the key
found was a member of the top-level object (one ``}`` closes it) and the last one, so a
``"NodeNames":`` nested in the pod, or a body shaped otherwise, decodes as an error and takes the
ordinary path. The key's quote must open a member (after ``{`` or ``,``): the same bytes can end
a longer key whose quote is escaped. A tail is remembered only after the whole body has been decoded once and the tail
itself decoded to exactly that list.
"""
from __future__ import annotations

import orjson

_KEY = b'"NodeNames":'
_CLOSE = b"null}"


class NodeNamesDecoder:
    """``loads(body)``: ``orjson.loads(body)``, with a repeated NodeNames tail not decoded again.
    Each answer gets a list of its own (the names themselves are shared, as strings are)."""

    __slots__ = ("_tail", "_names")

    def __init__(self) -> None:
        self._tail: bytes | None = None      # the bytes after the key, up to the body's end
        self._names: list[str] | None = None

    def loads(self, body: bytes):
        tail = self._tail
        if tail is not None and len(body) > len(tail) + len(_KEY) and body.endswith(tail):
            at = len(body) - len(tail)
            if body[at - len(_KEY):at] == _KEY and _opens_member(body, at - len(_KEY)):
                args = _top_level_prefix(body[:at])
                if args is not None:
                    args["NodeNames"] = list(self._names)
                    return args
        args = orjson.loads(body)
        self._remember(body, args)
        return args

    def _remember(self, body: bytes, args) -> None:
        names = args.get("NodeNames") if type(args) is dict else None
        if type(names) is not list or len(names) < 64:   # a short list costs nothing to decode
            return
        at = body.rfind(_KEY)
        if at < 0 or not _opens_member(body, at):
            return
        tail = body[at + len(_KEY):]
        closed = tail.rstrip()
        if not closed.endswith(b"}") or _top_level_prefix(body[:at + len(_KEY)]) is None:
            return
        try:
            if orjson.loads(closed[:-1]) != names:
                return
        except orjson.JSONDecodeError:
            return
        self._tail, self._names = tail, list(names)


def _opens_member(body: bytes, quote: int) -> bool:
    """Whether the ``"`` at ``quote`` opens an object member: after ``{`` or ``,`` (whitespace
    between allowed), not the escaped quote of a longer key such as ``"x\\"NodeNames":``, whose
    document would decode with NodeNames null all the same."""
    at = quote - 1
    while at >= 0 and body[at] in b" \t\r\n":
        at -= 1
    return at >= 0 and body[at] in b"{,"


def _top_level_prefix(prefix: bytes) -> dict | None:
    """The object ``prefix`` (up to and including ``"NodeNames":``) opens, with NodeNames null;
    None unless that key is the top-level object's last member."""
    try:
        args = orjson.loads(prefix + _CLOSE)
    except orjson.JSONDecodeError:
        return None
    if type(args) is not dict or "NodeNames" not in args or args["NodeNames"] is not None:
        return None
    return args
