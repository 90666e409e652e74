"""torch.compile as a plan dimension: compile a model for a plan, and report what compiling cost
and changed (compile time, recompilations, graph breaks, pay-back, agreement with eager)."""
