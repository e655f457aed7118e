"""pipeplan planner: graph model, cost model, plan, simulator, apply/verify. Imports nothing heavy."""
