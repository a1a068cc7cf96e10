"""The one cost model: layer costs, device speeds, links and all-reduce, a plan's stage costs and memory."""
