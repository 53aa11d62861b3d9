"""Traces: every message on every hop (sink), redaction, and the readers (view, html)."""
