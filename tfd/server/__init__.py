"""The daemon's surface: HTTP (starlette on hypercorn), the admin socket and systemd. Top layer: it
reaches the engine through its face (docs/architecture.md)."""
