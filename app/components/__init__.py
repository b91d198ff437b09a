"""Reusable view pieces: pure HTML/figure builders plus thin ``render_*`` helpers, and the
widget groups several pages share (example pickers, shipped-artifact notes)."""
