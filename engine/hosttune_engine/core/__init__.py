"""The life of a request: sequence, scheduler, model runner, engine loop."""
