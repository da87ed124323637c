"""The life of a request: sequence, block manager, scheduler, model runner, engine loop; the other tensor-parallel ranks that replay its steps."""
