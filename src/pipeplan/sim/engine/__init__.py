"""The discrete-event engine: a schedule and its costs in, the iteration's times, memory and timeline out."""
