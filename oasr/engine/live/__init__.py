"""Live text: the partial/final policy the engine loop calls through a few hooks (finals,
refined partials, endpoints and pauses); each stream's policy state lives here."""
