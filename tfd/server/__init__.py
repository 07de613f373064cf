"""The daemon's surface: HTTP (starlette on hypercorn), the admin socket and systemd."""
