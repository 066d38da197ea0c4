"""`/docs`: Swagger UI over TEI's OpenAPI document, with every asset served from this host.

The script and stylesheet come from the installed `swagger-ui-bundle` package (Swagger UI's
dist files), so the page renders on a host with no route out; nothing is fetched from a CDN.
The document is TEI's own (`openapi.json` in this package), on `/api-doc/openapi.json` (TEI's
path) and `/openapi.json`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from litestar import Response, route
from litestar.handlers.http_handlers import HTTPRouteHandler
from litestar.params import FromPath
from swagger_ui_bundle import swagger_ui_path

from tei_serve.http.protocol import GET_HEAD

ASSETS = {"swagger-ui.css": "text/css", "swagger-ui-bundle.js": "text/javascript"}

PAGE = """<!doctype html>
<html><head><title>Text Embeddings Inference</title><meta charset="utf-8"/>
<link rel="stylesheet" href="/docs/swagger-ui.css"/></head>
<body><div id="swagger-ui"></div>
<script src="/docs/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({url: "/api-doc/openapi.json", dom_id: "#swagger-ui"});</script>
</body></html>
"""


def openapi_document() -> bytes:
    return resources.files("tei_serve").joinpath("openapi.json").read_bytes()


def asset(name: str) -> bytes:
    return (Path(str(swagger_ui_path)) / name).read_bytes()


def docs_routes() -> list[HTTPRouteHandler]:
    """The page, its two assets and the document; none of them behind the API key, as in TEI."""
    document = openapi_document()
    files = {name: asset(name) for name in ASSETS}

    @route("/docs", http_method=GET_HEAD)
    async def page() -> Response[str]:
        return Response(content=PAGE, media_type="text/html")

    @route("/docs/{name:str}", http_method=GET_HEAD)
    async def docs_asset(name: FromPath[str]) -> Response[bytes]:
        if name not in files:
            return Response(content=b"", status_code=404)
        return Response(content=files[name], media_type=ASSETS[name],
                        headers={"cache-control": "public, max-age=86400"})

    @route(["/api-doc/openapi.json", "/openapi.json"], http_method=GET_HEAD)
    async def openapi() -> Response[bytes]:
        return Response(content=document, media_type="application/json")

    return [page, docs_asset, openapi]
