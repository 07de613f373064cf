"""The admin socket's commands by name, each with what it does: the daemon answers exactly these
(``tfd.server.daemon``) and ``tfd admin -h`` lists them, without importing the daemon."""

from __future__ import annotations

COMMANDS = {
    "status": "state, version, pid, uptime, binds, running requests and memory",
    "settings": "every setting's effective value and where it came from",
    "pool": "the load report and the pool's census",
    "lanes": "each running or waiting request: its id, phase and tokens",
    "learn": "what the prompt cache holds and did",
    "evict": "drop every kept prompt state",
    "cancel": "cancel one request, by the id its client saw (cancel ID)",
    "drain": "stop admitting, finish what runs, exit (as SIGTERM)",
}
