"""Typed payloads: a job's JSON payload decoded into the type a handler declares.

    @dataclasses.dataclass
    class Signup:
        email: str
        name: str

    @worker.handler("emails")
    async def send(job: jobbroker.JobContext, signup: Signup) -> None: ...

The type may be a pydantic model (any class with pydantic v2's `model_validate_json`: pydantic
is not a dependency of this package, a program that has it uses it), a dataclass (nested
dataclasses, lists and dicts of them are converted too; keys the dataclass does not have are
ignored, so producers may add fields before the workers know them), a TypedDict (its required
keys checked, the value stays a dict), or any other type JSON gives (str, int, float, bool, list,
dict, Any). A payload that does not fit is a ValueError or TypeError, which the worker turns into
a PermanentError: another attempt would get the same payload.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_SCALARS: dict[Any, tuple[type, ...]] = {
    str: (str,), int: (int,), float: (int, float), bool: (bool,), type(None): (type(None),)
}


def decode_payload(payload: bytes, tp: type[T]) -> T:
    """The payload as a `tp` (see the module's doc); ValueError or TypeError if it is not one."""
    validate_json = getattr(tp, "model_validate_json", None)
    if callable(validate_json):  # a pydantic model: its own validation, errors and defaults
        return typing.cast(T, validate_json(payload))
    return typing.cast(T, convert(json.loads(payload), tp, ""))


def convert(value: Any, tp: Any, where: str) -> Any:
    """`value` (decoded JSON) as a `tp`."""
    if tp is Any or tp is object:
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise TypeError(f"{_at(where)}a JSON object for {tp.__name__}, not {_kind(value)}")
        hints = typing.get_type_hints(tp)
        kwargs = {f.name: convert(value[f.name], hints.get(f.name, Any), _key(where, f.name))
                  for f in dataclasses.fields(tp) if f.init and f.name in value}
        missing = [f.name for f in dataclasses.fields(tp)
                   if f.init and f.name not in value and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise TypeError(f"{_at(where)}{tp.__name__} needs {', '.join(missing)}")
        return tp(**kwargs)
    if typing.is_typeddict(tp):
        if not isinstance(value, dict):
            raise TypeError(f"{_at(where)}a JSON object for {tp.__name__}, not {_kind(value)}")
        # From the resolved hints: under `from __future__ import annotations` Python 3.11's
        # __required_keys__ cannot see NotRequired[...] in a string annotation.
        hints = typing.get_type_hints(tp, include_extras=True)
        required = set()
        for key, hint in hints.items():
            marker = typing.get_origin(hint)
            if marker in (typing.Required, typing.NotRequired):
                hints[key] = typing.get_args(hint)[0]
            if marker is typing.Required or (marker is not typing.NotRequired
                                             and key in tp.__required_keys__):
                required.add(key)
        missing = sorted(required - value.keys())
        if missing:
            raise TypeError(f"{_at(where)}{tp.__name__} needs {', '.join(missing)}")
        return {k: convert(v, hints[k], _key(where, k)) if k in hints else v
                for k, v in value.items()}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        errors = []
        for option in args:
            try:
                return convert(value, option, where)
            except (TypeError, ValueError) as err:
                errors.append(str(err))
        raise TypeError(f"{_at(where)}fits none of {tp}: {'; '.join(errors)}")
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{_at(where)}{value!r} is not one of {list(args)}")
        return value
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple, set, frozenset):
        if not isinstance(value, list):
            raise TypeError(f"{_at(where)}a JSON array, not {_kind(value)}")
        item = args[0] if args and origin is not tuple else Any
        items = [convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return (origin or tp)(items)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise TypeError(f"{_at(where)}a JSON object, not {_kind(value)}")
        item = args[1] if len(args) == 2 else Any
        return {k: convert(v, item, _key(where, k)) for k, v in value.items()}
    if tp in _SCALARS:
        wanted = _SCALARS[tp]
        if not isinstance(value, wanted) or (tp is not bool and isinstance(value, bool)):
            raise TypeError(f"{_at(where)}{_kind(value)} where {tp.__name__} was expected")
        return float(typing.cast(float, value)) if tp is float else value
    return value  # other annotations: as JSON decoded it


def _key(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _at(where: str) -> str:
    return f"{where}: " if where else ""


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(value), "a value")


def payload_type(fn: Callable[..., Any]) -> Any | None:
    """The type of a handler's second parameter (`async def h(job, data: T)`), or None for a
    handler of the JobContext alone."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if len(params) != 2 or params[1].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD):
        return None
    try:
        hints = typing.get_type_hints(fn)
    except Exception as err:  # an annotation that names something not importable there
        raise TypeError(f"handler {fn!r}: cannot resolve its annotations: {err}") from err
    return hints.get(params[1].name, Any)
