"""The OpenAI-compatible HTTP server: `hosttune-engine serve --model PATH`.

Modules: schemas/ (request bodies, a module per endpoint) and responses
(response bodies), api_errors, bodies (JSON in and out), app (routes), completions and streaming (generation
endpoints, SSE), generation (one request's sequences), engine_client (the
event loop's side of the engine thread), prompts, admission, metrics, health,
warmup, state (what handlers share), config, serve (lifecycle), options (serve's options, torch-free), cli.
"""
