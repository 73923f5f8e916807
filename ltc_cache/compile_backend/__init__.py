"""Layer 2, the `torch.compile(backend="ltc_cache")` backend, built on `graph`.

`backend` is what Dynamo calls; through AOTAutograd (`plan_compile`, and
`aot_autograd`, the one module touching its private surface) it decomposes
(`decompose`, `decompose_vision`), sorts ops into what LTC lowers
(`support`), cuts the graph into regions (`partition`, `region_cuts`,
`buffer_writes`), and stores a graph's forward and backward as a plan
(`plan`, `joint`, `joint_switch`) so a warm start runs no AOTAutograd.
`first_call` runs what was compiled (regions extracted on their first real
call, eager where that fails), `per_shape` compiles graphs with symbolic
shapes once per concrete shape (`specialize`, `nodes`), and `model_names`
names the entries.
"""
