"""Errors answered to the client as OpenAI error bodies (`{"error": {"message", "type", "param", "code"}}`)."""

from __future__ import annotations


class ApiError(Exception):
    """An error answered to the client as an OpenAI error body."""

    def __init__(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message[:1000], type_, param


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)
