"""The ``tfd`` command's exit statuses beside 0 (done) and ``SettingsRefused.EXIT_STATUS`` (2)."""

EXIT_FAILURE = 1  # it ran and failed: a checkpoint that would not load, an admin command refused
EXIT_INTERRUPTED = 130  # SIGINT, as a shell reports it
