"""OpenAI request bodies as pydantic models, one module per endpoint, and the 400 a body that breaks a rule gets.

Modules: body (the base model, null handling, the 400 naming the field), options
(the fields completions and chat share, the unsupported ones refused), completion
(/v1/completions), chat (/v1/chat/completions), tokenize (/tokenize, /detokenize).
Import each model from its module. Response bodies are built in `server/responses.py`.
"""
