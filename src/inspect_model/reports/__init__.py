"""Typed report records (issue 35): each command's ``--json`` body as frozen dataclasses
(``base.Record``), one module per command plus the records several share (``common``).
The published JSON Schemas (``schemas/<command>.json``) are generated from these types by
:mod:`inspect_model.schemas.generate`; nothing here imports torch."""
