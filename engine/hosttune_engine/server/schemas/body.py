"""What every request body shares: the pydantic base model, and the 400 a body that breaks a rule gets.

A model takes decoded JSON. Null means "use the default", as in OpenAI's API (but for a model's `NULL_IS_A_VALUE` fields);
unknown fields are ignored (as vLLM does). Fields are checked in the order they
are declared and the first fault is the answer: an `ApiError` (HTTP 400) whose
message names the field and what it must be, in vLLM's wording where vLLM has
one, never quoting more than a few characters of what the client sent. The
readers here (`describe`, `fault`, `token_ids`) serve every endpoint's model.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from hosttune_engine.server.api_errors import ApiError, bad_request

INT64 = 2**63

# pydantic's error types, as "<name> must be <expected>, got <what was sent>"
_EXPECTED = {"int_type": "an integer", "float_type": "a finite number", "finite_number": "a finite number",
             "bool_type": "a boolean", "string_type": "a string", "dict_type": "an object"}


def describe(value) -> str:
    """A JSON value's type, and a short value for scalars (never the whole input)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"number {str(value)[:24]}"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def fault(message: str, param: str | None) -> PydanticCustomError:
    """A rule broken inside a validator; `param` is the field the answer names."""
    return PydanticCustomError("api", "{message}", {"message": message, "param": param})


def _as_api_error(error: dict) -> ApiError:
    name = error["loc"][0] if error["loc"] else None
    ctx, kind, value = error.get("ctx") or {}, error["type"], error.get("input")
    if kind == "api":
        return bad_request(ctx["message"], ctx["param"])
    if kind in _EXPECTED:
        return bad_request(f"{name} must be {_EXPECTED[kind]}, got {describe(value)}", name)
    if kind in ("greater_than_equal", "less_than_equal"):
        word, bound = ("least", ctx["ge"]) if "ge" in ctx else ("most", ctx["le"])
        bound = int(bound) if float(bound).is_integer() else bound
        return bad_request(f"{name} must be at {word} {bound}, got {str(value)[:24]}", name)
    return bad_request(f"{name}: {error['msg']}", name)


def is_int(v) -> bool:
    """A JSON integer: an int that is not a boolean."""
    return isinstance(v, int) and not isinstance(v, bool)


def _integral(value):
    """An integral float (16.0) as its int, as vLLM's lax pydantic reads one within 64 bits; 16.5 and 1e308 are
    left to be refused."""
    if isinstance(value, float) and value.is_integer() and -INT64 < value < INT64:
        return int(value)
    return value


Integer = Annotated[int, BeforeValidator(_integral)]  # a JSON integer, written 16 or 16.0


def zero_or_one(value):
    """0 and 1 (or 0.0 and 1.0) as false and true, as vLLM's lax pydantic reads a boolean; any other number is
    left to be refused."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    return value


Boolean = Annotated[bool, BeforeValidator(zero_or_one)]  # a JSON boolean, or 0 or 1


def token_ids(value, name: str) -> tuple[int, ...]:
    """An array of token ids, or the 400 naming `name`."""
    if not isinstance(value, list) or not all(is_int(t) and 0 <= t < INT64 for t in value):
        raise fault(f"{name} must be an array of non-negative integer token ids", name)
    return tuple(value)


def positive_max_tokens(value: int | None, info: ValidationInfo) -> int | None:
    """A validator for a token budget (max_tokens, max_completion_tokens): unset, or at least 1."""
    if value is not None and value < 1:
        raise fault(f"{info.field_name} must be at least 1, got {value}.", info.field_name)
    return value


class RequestBody(BaseModel):
    """A request body: strict types, unknown fields ignored, nulls dropped, frozen once parsed."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    NULL_IS_A_VALUE: ClassVar[frozenset[str]] = frozenset()  # fields whose null is not their default

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, body):
        if not isinstance(body, dict):
            raise fault(f"the request body must be a JSON object, got {describe(body)}", None)
        return {k: v for k, v in cls._whole_body(body).items() if v is not None or k in cls.NULL_IS_A_VALUE}

    @classmethod
    def _whole_body(cls, body: dict) -> dict:
        """Rules about the body as a whole, checked before its fields."""
        return body

    @classmethod
    def parse(cls, body):
        """The parsed model, or the `ApiError` (400) of the first field that breaks a rule."""
        try:
            return cls.model_validate(body)
        except ValidationError as e:
            raise _as_api_error(e.errors()[0]) from None
