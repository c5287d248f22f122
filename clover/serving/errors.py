"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, never a traceback."""

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("clover.serve")


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class ClientGone(Exception):
    """The client disconnected before its response was complete (nobody reads the reply)."""


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def unauthorized() -> APIError:
    return APIError(401, "Invalid or missing API key. Pass it as 'Authorization: Bearer <key>'.",
                    "authentication_error", code="invalid_api_key")


def model_not_found(name: str, served: str) -> APIError:
    return APIError(404, f"The model '{name}' does not exist. This server serves '{served}'.",
                    param="model", code="model_not_found")


def too_large(limit: int) -> APIError:
    return APIError(413, f"The request body exceeds the limit of {limit} bytes.", code="request_too_large")


def body_timeout(seconds: float) -> APIError:
    return APIError(408, f"The request body did not arrive within {seconds:g} s.", code="request_timeout",
                    headers={"Connection": "close"})


def queue_full(message: str, retry_after_s: int = 1) -> APIError:
    return APIError(429, f"The server is at capacity: {message}. Retry later.", "rate_limit_error",
                    code="queue_full", headers={"Retry-After": str(retry_after_s)})


def loading() -> APIError:
    return APIError(503, "The model is still loading. Retry shortly.", "service_unavailable",
                    code="model_loading", headers={"Retry-After": "5"})


def internal(message: str = "The server failed while handling this request.") -> APIError:
    return APIError(500, message, "server_error", code="internal_error")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "Invalid request.", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return "The request body is not valid JSON.", None
    param = ".".join(loc) or None
    where = f" at '{param}'" if param else ""
    return f"Invalid request{where}: {first.get('msg', 'invalid value')}.", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        log.info("refused %s %s: %d %s", request.method, request.url.path, exc.status, exc.code or exc.type)
        return exc.response()

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone):
        return Response(status_code=499)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        log.info("refused %s %s: 400 %s", request.method, request.url.path, message)
        return bad_request(message, param).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return APIError(exc.status_code, str(exc.detail), type_).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return internal().response()
