"""Scalar value types of ``scalers.yaml`` and the two object base classes (strict, loose).

Numbers and integers as zod reads them, canonical labels, host-access entries (validated by
``network.host_access``), memory strings; SPEC (a.2)-(a.8).
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from lib.units import InvalidMemoryFormat, parse_memory
from scalers import labels as labelmod

from .issues import describe_value

# --------------------------------------------------------------------------- scalar types


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PydanticCustomError(
            "number_type", "Expected a number, received {received}", {"received": describe_value(value)}
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise PydanticCustomError(
            "number_type", "Expected a finite number, received {received}", {"received": describe_value(value)}
        )
    return value


def _integer(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PydanticCustomError(
            "int_type", "Expected an integer, received {received}", {"received": describe_value(value)}
        )
    if isinstance(value, float):
        if not value.is_integer():
            raise PydanticCustomError(
                "int_type", "Expected an integer, received {received}", {"received": describe_value(value)}
            )
        return int(value)
    return value


#: A JSON/YAML number (int or float, never a bool or a numeric string), as zod's z.number().
Number = Annotated[int | float, BeforeValidator(_number)]
#: An integer (an integral float such as 2.0 is accepted, as in JavaScript).
Integer = Annotated[int, BeforeValidator(_integer)]


def _label(value: str, *, where: str) -> str:
    text = value.strip()
    if not text:
        raise ValueError(f"Label must not be empty, received {describe_value(value)}")
    if labelmod.is_reserved_label(text):
        raise ValueError(
            f"Labels with 'kici:' prefix are reserved and cannot be used in {where}, received {describe_value(value)}"
        )
    if "," in text:
        raise ValueError(
            f"Labels must not contain ',' (label sets are keyed as comma-joined lists), "
            f"received {describe_value(value)}"
        )
    return text.lower()


def _set_label(value: str) -> str:
    return _label(value, where="scaler labelSets")


def _mandatory_label(value: str) -> str:
    return _label(value, where="mandatoryLabels")


Label = Annotated[str, AfterValidator(_set_label)]
MandatoryLabel = Annotated[str, AfterValidator(_mandatory_label)]
NonEmptyStr = Annotated[str, Field(min_length=1)]


def _host_access_entry(value: str) -> str:
    # Imported here: network/ is another app's module, loaded only when needed.
    from network.host_access import parse_host_access_entry

    parse_host_access_entry(value)  # raises ValueError naming the entry (SPEC g.1)
    return value


HostAccessEntry = Annotated[str, AfterValidator(_host_access_entry)]


def _memory_string(value: str) -> str:
    try:
        parse_memory(value)
    except InvalidMemoryFormat as exc:
        raise ValueError(str(exc)) from None
    return value


# --------------------------------------------------------------------------- base classes


class _Strict(BaseModel):
    """Object that refuses unknown keys (zod ``.strict()``)."""

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_means_absent(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(v is None for v in data.values()):
            return {k: v for k, v in data.items() if v is not None}
        return data


class _Loose(_Strict):
    """Object that silently drops unknown keys (zod's default)."""

    model_config = ConfigDict(alias_generator=to_camel, extra="ignore", frozen=True)
