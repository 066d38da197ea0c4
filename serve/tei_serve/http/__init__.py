"""The HTTP front-end: TEI's routes over `tei_serve.serving` with Litestar."""
