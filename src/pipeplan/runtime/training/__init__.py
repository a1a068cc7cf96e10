"""A training run from start to end: --local's processes, one worker, the synchronous, asynchronous and adaptive loops."""
