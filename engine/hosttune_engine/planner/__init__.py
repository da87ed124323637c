"""Building a model's kernel plan (`planner.build`), preparing the model from it (`planner.prepare`), and
`hosttune-engine plan` (`planner.command`)."""
