"""Nothing without a login when the dashboard is started with ``--auth``.

gradio checks the login on its API routes, but without one it still answers some: the page at
``/`` carries the whole API description (every endpoint, its parameters and their defaults:
the preset list, the Try tab's runs), ``/openapi.json`` answers and the heartbeat holds a
connection open. :class:`LoginWall` sits in front of every route of the app: a request without
a valid login cookie gets 401, except the login itself, the page shell (its login form, built
here with no API description and no components) and the page's static files (scripts, styles,
icons). :func:`app_kwargs` hands it to ``gr.Blocks.launch``. Without ``--auth`` it lets
everything through (the dashboard then listens on this machine only, or was opened with
``--no-auth`` on purpose).
"""

from __future__ import annotations

from typing import Any

# reached without a login: the login form's page, its POST, and the files the page loads
PUBLIC_PATHS = frozenset({"/login", "/login/", "/logout", "/favicon.ico", "/theme.css", "/robots.txt",
                          "/manifest.json", "/pwa_icon", "/gradio_api/theme.css",
                          "/gradio_api/login_check", "/gradio_api/login_check/"})
PUBLIC_PREFIXES = ("/assets/", "/static/", "/svelte/", "/pwa_icon/")  # the frontend's own files
SHELL_PATHS = frozenset({"", "/"})  # the page: the login form only, until logged in
STARTUP = "/gradio_api/startup-events"  # called once by gradio's launch on this machine


def is_public(path: str) -> bool:
    """Whether a request path is answered without a login (the login form and static files)."""
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def logged_in(app: Any, cookies: dict[str, str]) -> bool:
    """Whether the request's cookies hold a login of this app (gradio's own tokens)."""
    for name in (f"access-token-{app.cookie_id}", f"access-token-unsecure-{app.cookie_id}"):
        token = cookies.get(name)
        if token and app.tokens.get(token) is not None:
            return True
    return False


class LoginWall:
    """ASGI middleware: 401 for every request without a login, but the public ones (see the
    module's doc); the page's shell is the login form without the API description."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        from starlette.requests import HTTPConnection

        gradio_app = scope.get("app")
        conn = HTTPConnection(scope)
        if gradio_app is None or getattr(gradio_app, "auth", None) is None \
                or logged_in(gradio_app, conn.cookies):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        # gradio's launch calls startup-events itself once, before any page: let that one through
        first_start = path == STARTUP and not getattr(gradio_app, "startup_events_triggered", True)
        if scope["type"] == "http" and (is_public(path) or first_start):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http" and path in SHELL_PATHS and scope.get("method") in ("GET", "HEAD"):
            await login_page(gradio_app, scope, receive)(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation: no login
            return
        from starlette.responses import JSONResponse

        await JSONResponse({"detail": "Not authenticated"}, status_code=401)(scope, receive, send)


def login_page(gradio_app: Any, scope: dict, receive: Any) -> Any:
    """gradio's page with the login form only: no components, no events, no API description."""
    from gradio import route_utils
    from gradio.routes import templates
    from starlette.requests import Request

    request = Request(scope, receive)
    blocks = gradio_app.get_blocks()
    root = route_utils.get_root_url(request=request, route_path="/",
                                    root_path=gradio_app.root_path or scope.get("root_path"))
    config = {"auth_required": True, "auth_message": blocks.auth_message, "space_id": None,
              "root": root, "page": {"": {"layout": {}}}, "pages": [""], "components": [],
              "dependencies": [], "current_page": ""}
    return templates.TemplateResponse(
        request=request, name="frontend/index.html",
        context={"base_url": "./", "config": config,
                 "gradio_api_info": {"named_endpoints": {}, "unnamed_endpoints": {}}},
        status_code=200)


def app_kwargs() -> dict[str, Any]:
    """What ``gr.Blocks.launch(app_kwargs=...)`` takes: the wall in front of every route, and no
    FastAPI description pages (/openapi.json, /docs, /redoc)."""
    from starlette.middleware import Middleware

    return {"middleware": [Middleware(LoginWall)], "openapi_url": None, "docs_url": None,
            "redoc_url": None}
