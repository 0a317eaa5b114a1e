"""The base of every model read from a user's file (traffic mixes, pools, validation suites).

YAML reads `true`, `yes` and `on` as booleans, and pydantic's lax mode would take a boolean
where a number is due as 1 or 0: `rate_rps: yes` would run at one request a second. Such a
value is refused here, naming the field; fields that are booleans take them as before.
"""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError


def _takes_bool(annotation: Any) -> bool:
    if annotation is bool or annotation is Any:
        return True
    return any(_takes_bool(a) for a in get_args(annotation))


class InputModel(BaseModel):
    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        errors: list[InitErrorDetails] = []
        for name, field in cls.model_fields.items():
            key = field.alias if field.alias is not None and field.alias in data else name
            value = data.get(key)
            if isinstance(value, bool) and not _takes_bool(field.annotation):
                errors.append(InitErrorDetails(
                    type=PydanticCustomError(
                        "bool_for_a_number",
                        "{value} is a yes/no, not a value: give a number",
                        {"value": str(value).lower()}),
                    loc=(key,), input=value))
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return data
