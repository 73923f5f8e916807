"""Layer 2, the `torch.compile(backend="ltc_cache")` backend, built on `graph`.

`backend` is what Dynamo calls; it decomposes (`decompose`), sorts ops into
what LTC lowers (`support`), cuts the graph into regions (`partition`), and
stores a graph's forward and backward as a plan (`plan`, `joint`,
`joint_switch`) so a warm start runs no AOTAutograd; `specialize` and
`nodes` read symbolic shapes and node values.
"""
