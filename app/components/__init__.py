"""Reusable view pieces: pure HTML/figure builders plus thin ``render_*`` helpers."""
