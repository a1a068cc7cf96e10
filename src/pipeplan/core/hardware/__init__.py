"""The machines a plan runs on, as values: devices (the GPU catalogue), cluster, links (link matrices, Link) and
bandwidth_trace (each link's factor over time)."""
